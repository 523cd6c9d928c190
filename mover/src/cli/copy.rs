//! `ferry-mover copy SRC DST` (issue 2).

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct CopyArgs {
    /// Source directory.
    pub src: PathBuf,
    /// Destination directory (created if missing).
    pub dst: PathBuf,
}

pub fn run(_args: CopyArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("copy is not implemented yet")
}
