//! `ferry-mover cas stats|verify|gc DIR` (issue 5).

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Subcommand, Debug)]
pub enum CasCommand {
    /// Print block count, bytes and cap.
    Stats { dir: PathBuf },
    /// Re-hash every block and discard bad ones.
    Verify { dir: PathBuf },
    /// Evict least recently used blocks down to the cap.
    Gc { dir: PathBuf },
}

pub fn run(_cmd: CasCommand) -> anyhow::Result<ExitCode> {
    anyhow::bail!("cas is not implemented yet")
}
