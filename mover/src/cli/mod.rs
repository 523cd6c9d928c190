//! Command-line interface: one module per subcommand family, each owning its flags and its `run`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod cas;
pub mod copy;
pub mod net;
pub mod staging;

/// ferry's data mover: copies directory trees locally or over parallel mutual-TLS streams.
#[derive(Parser, Debug)]
#[command(name = "ferry-mover", version, about, propagate_version = true)]
pub struct Cli {
    /// More log output (repeat for more); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Copy a directory tree locally.
    Copy(copy::CopyArgs),
    /// Write a throwaway CA and sender/receiver certificates for one transfer.
    Certs(net::CertsArgs),
    /// Send a tree to a receiver.
    #[command(after_help = crate::kind::EXIT_STATUS_HELP)]
    Send(net::SendArgs),
    /// Receive trees from senders.
    #[command(after_help = crate::kind::EXIT_STATUS_HELP)]
    Receive(net::ReceiveArgs),
    /// Inspect and maintain a block store.
    #[command(subcommand)]
    Cas(cas::CasCommand),
    /// Remove a transfer's resume state from a destination (`.ferry-staging/`).
    CleanStaging(staging::CleanStagingArgs),
}

/// Runs a parsed command line; the exit code reflects partial failures (for example files that
/// could not be copied), errors are for failures of the whole command.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Copy(args) => copy::run(args),
        Command::Certs(args) => net::run_certs(args),
        Command::Send(args) => net::run_send(args),
        Command::Receive(args) => net::run_receive(args),
        Command::Cas(cmd) => cas::run(cmd),
        Command::CleanStaging(args) => staging::run(args),
    }
}

/// Logs go to stderr so stdout stays machine-readable (`--json`, bound addresses).
pub fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
