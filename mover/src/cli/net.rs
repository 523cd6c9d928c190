//! `ferry-mover certs|send|receive` (issue 4).

use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct CertsArgs {}

#[derive(clap::Args, Debug)]
pub struct SendArgs {}

#[derive(clap::Args, Debug)]
pub struct ReceiveArgs {}

pub fn run_certs(_args: CertsArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("certs is not implemented yet")
}

pub fn run_send(_args: SendArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("send is not implemented yet")
}

pub fn run_receive(_args: ReceiveArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("receive is not implemented yet")
}
