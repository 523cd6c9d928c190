//! Prints the Transfer CRD (YAML) generated from the Rust types; `make crds` writes it to crds/.

fn main() -> anyhow::Result<()> {
    print!("{}", ferry_operator::crd_yaml()?);
    Ok(())
}
