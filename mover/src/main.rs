//! The `ferry-mover` binary: parse flags, set up logging, hand over to the library.

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = ferry_mover::cli::parse();
    ferry_mover::cli::init_output(&cli);
    match ferry_mover::cli::run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("ferry-mover: error: {err:#}");
            ExitCode::from(2)
        }
    }
}
