//! Command-line interface: one module per subcommand family, each owning its flags and its `run`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod addr;
pub mod cas;
pub mod copy;
pub mod filter;
pub mod net;
pub mod node;
pub mod staging;

/// ferry's data mover: copies directory trees locally or over parallel mutual-TLS streams.
#[derive(Parser, Debug)]
#[command(name = "ferry-mover", version, about, propagate_version = true)]
pub struct Cli {
    /// List each entry created, updated or deleted, on stdout (as rsync -v).
    #[arg(short, long, global = true)]
    pub verbose: bool,
    /// List each change with rsync's itemized code (`>f+++++++++ path`, `*deleting   path`).
    #[arg(short, long, global = true)]
    pub itemize_changes: bool,
    /// Log level: error, warn (the default), info, debug or trace; RUST_LOG overrides.
    #[arg(long, global = true, value_parser = ["error", "warn", "info", "debug", "trace"])]
    pub log_level: Option<String>,
    /// Errors only: no progress bar, no summary (--json output stays).
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// No progress bar (it is drawn only when stderr is a terminal anyway).
    #[arg(long, global = true)]
    pub no_progress: bool,
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
    #[command(after_help = ferry_proto::kind::EXIT_STATUS_HELP)]
    Send(net::SendArgs),
    /// Receive trees from senders.
    #[command(after_help = ferry_proto::kind::EXIT_STATUS_HELP)]
    Receive(net::ReceiveArgs),
    /// Inspect and maintain a block store.
    #[command(subcommand)]
    Cas(cas::CasCommand),
    /// The node service: this node's block store for the receivers on it.
    #[command(subcommand)]
    Node(node::NodeCommand),
    /// Remove a transfer's resume state from a destination (`.ferry-staging/`).
    CleanStaging(staging::CleanStagingArgs),
    /// Print a shell completion script (for example: ferry-mover completions bash >
    /// /etc/bash_completion.d/ferry-mover).
    Completions { shell: clap_complete::Shell },
    /// Print the manual page (roff; man -l <(ferry-mover man)).
    Man,
}

/// Parses the process's command line (with the order of `--exclude`/`--include` rules).
pub fn parse() -> Cli {
    use clap::{CommandFactory as _, FromArgMatches as _};
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Some((_, sub)) = matches.subcommand() {
        match &mut cli.command {
            Command::Copy(a) => a.filter.order_from(sub),
            Command::Send(a) => a.filter.order_from(sub),
            _ => {}
        }
    }
    cli
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
        Command::Node(cmd) => node::run(cmd),
        Command::CleanStaging(args) => staging::run(args),
        // Rendered into memory first: the generators panic on a closed pipe (`| head`).
        Command::Completions { shell } => {
            let mut script = Vec::new();
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "ferry-mover", &mut script);
            print_ignoring_closed_pipe(&script)
        }
        Command::Man => {
            let mut page = Vec::new();
            clap_mangen::Man::new(<Cli as clap::CommandFactory>::command()).render(&mut page)?;
            print_ignoring_closed_pipe(&page)
        }
    }
}

fn print_ignoring_closed_pipe(bytes: &[u8]) -> anyhow::Result<ExitCode> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(bytes) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(ExitCode::SUCCESS),
    }
}

/// Logs go to stderr so stdout stays machine-readable (`--json`, bound addresses), coloured only
/// when stderr is a terminal. Also applies `--quiet` and `--no-progress`.
pub fn init_output(cli: &Cli) {
    use crate::report::changes::{Listing, set_listing};
    crate::report::configure(cli.quiet, cli.no_progress);
    set_listing(if cli.itemize_changes {
        Listing::Itemized
    } else if cli.verbose {
        Listing::Names
    } else {
        Listing::Off
    });
    let default = match (cli.quiet, cli.log_level.as_deref()) {
        (_, Some(level)) => level,
        (true, None) => "error",
        (false, None) => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}
