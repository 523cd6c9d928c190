use clap::Parser;

/// ferry's Kubernetes operator.
#[derive(Parser, Debug)]
#[command(name = "ferry-operator", version, about)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    anyhow::bail!(
        "the {}/{} controller is not implemented yet; use `ferry-mover` directly",
        ferry_operator::API_GROUP,
        ferry_operator::API_VERSION
    )
}
