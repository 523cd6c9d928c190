//! Prints a CRD (YAML) generated from the Rust types: the Transfer's, or with `peer` the
//! Peer's; `make crds` writes both to crds/.

fn main() -> anyhow::Result<()> {
    match std::env::args().nth(1).as_deref() {
        None | Some("transfer") => print!("{}", ferry_operator::crd_yaml()?),
        Some("peer") => print!("{}", ferry_operator::peer_crd_yaml()?),
        Some(other) => anyhow::bail!("unknown CRD {other:?}: use transfer or peer"),
    }
    Ok(())
}
