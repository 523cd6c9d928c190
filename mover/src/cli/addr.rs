//! `--connect` and `--listen` addresses as people write them: `HOST:PORT` with a name or an IP
//! (`[v6]:PORT`), or `:PORT` for a default host. In a cluster the operator may hand a mover a
//! Service name rather than an IP.

use std::net::SocketAddr;

use anyhow::Context as _;

/// Resolves `spec`; `:PORT` means `default_host:PORT`. The first address the resolver returns
/// wins (IPv4 and IPv6 in the resolver's order).
pub async fn resolve(spec: &str, default_host: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(addr) = spec.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let full = match spec.strip_prefix(':') {
        Some(port) => format!("{default_host}:{port}"),
        None => spec.to_owned(),
    };
    let (host, port) = full
        .rsplit_once(':')
        .filter(|(h, p)| !h.is_empty() && !p.is_empty())
        .with_context(|| format!("{spec:?} is not HOST:PORT or :PORT"))?;
    port.parse::<u16>()
        .with_context(|| format!("{spec:?}: {port:?} is not a port number"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    tokio::net::lookup_host((host, port.parse::<u16>()?))
        .await
        .with_context(|| format!("cannot resolve {host:?} (from {spec:?})"))?
        .next()
        .with_context(|| format!("{host:?} (from {spec:?}) has no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ip_name_and_bare_port_forms() {
        assert_eq!(
            resolve("127.0.0.1:7400", "x").await.unwrap(),
            "127.0.0.1:7400".parse().unwrap()
        );
        assert_eq!(
            resolve("[::1]:7400", "x").await.unwrap(),
            "[::1]:7400".parse().unwrap()
        );
        assert_eq!(
            resolve(":7400", "0.0.0.0").await.unwrap(),
            "0.0.0.0:7400".parse().unwrap()
        );
        let local = resolve("localhost:7400", "x").await.unwrap();
        assert!(local.ip().is_loopback() && local.port() == 7400, "{local}");
    }

    #[tokio::test]
    async fn malformed_addresses_are_refused_with_the_reason() {
        for (bad, why) in [
            ("7400", "not HOST:PORT"),
            ("host:", "not HOST:PORT"),
            ("host:port", "not a port number"),
            ("host:99999", "not a port number"),
        ] {
            let e = format!("{:#}", resolve(bad, "0.0.0.0").await.unwrap_err());
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
