//! Peer identity and pre-authentication limits: wrong transfer, role confusion, silent clients,
//! and the progress service's operator-only access.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ferry_mover::net::{self, Role};
use ferry_mover::progress::{Phase, Progress, connect_progress, serve_progress};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Runs a TLS server with `server_files` accepting `accepted` and a client with `client_files`
/// accepting `client_accepts`; returns (server result, client result) as error strings.
async fn handshake(
    server_files: &net::TlsFiles,
    accepted: &[Role],
    client_files: &net::TlsFiles,
    client_accepts: &[Role],
) -> (Result<(), String>, Result<(), String>) {
    let server = Arc::new(net::server_config(server_files, accepted).unwrap());
    let client = Arc::new(net::client_config(client_files, client_accepts).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let srv = tokio::spawn(async move {
        let (tcp, a) = listener.accept().await.unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        match net::accept_tls(tcp, a, &acceptor, Duration::from_secs(5)).await {
            Ok(mut s) => {
                // TLS 1.3: the client's certificate is checked after the client finished, so
                // read to surface a late refusal.
                let mut b = [0u8; 1];
                let _ = s.read(&mut b).await;
                Ok(())
            }
            Err(e) => Err(ferry_mover::session::error_chain(&e)),
        }
    });
    let cli = match net::connect_tls(addr, client, Duration::from_secs(5)).await {
        Ok(mut s) => {
            let _ = s.write_all(b"x").await;
            let mut b = [0u8; 1];
            match s.read(&mut b).await {
                Err(e) => Err(e.to_string()),
                Ok(_) => Ok(()),
            }
        }
        Err(e) => Err(ferry_mover::session::error_chain(&e)),
    };
    (srv.await.unwrap(), cli)
}

#[tokio::test]
async fn certificate_for_another_transfer_is_refused_naming_both_identities() {
    let a = pki("transfer-a");
    let b = pki("transfer-b");
    // Chain failure across CAs: refused, message mentions the certificate problem.
    let (srv, cli) = handshake(
        &a.files(Role::Receiver),
        &[Role::Sender],
        &b.files(Role::Sender),
        &[Role::Receiver],
    )
    .await;
    assert!(srv.is_err() || cli.is_err(), "cross-CA handshake succeeded");

    // Same CA, wrong transfer id in the SAN: build leaves for transfer-b signed by a's CA.
    let mixed = mixed_pki("transfer-a", "transfer-b");
    // An honest client for transfer-b refuses the transfer-a receiver itself...
    let (_srv, cli) = handshake(
        &mixed.files_as(Role::Receiver, "transfer-a"),
        &[Role::Sender],
        &mixed.files_as(Role::Sender, "transfer-b"),
        &[Role::Receiver],
    )
    .await;
    let err = cli.unwrap_err();
    assert!(
        err.contains("urn:ferry:transfer:transfer-a:role:receiver"),
        "{err}"
    );
    assert!(
        err.contains("urn:ferry:transfer:transfer-b:role:sender"),
        "{err}"
    );

    // ...and a client that skips its own checks is refused by the receiver's verifier.
    let server_files = mixed.files_as(Role::Receiver, "transfer-a");
    let server = Arc::new(net::server_config(&server_files, &[Role::Sender]).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let srv = tokio::spawn(async move {
        let (tcp, a) = listener.accept().await.unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        match net::accept_tls(tcp, a, &acceptor, Duration::from_secs(5)).await {
            Ok(mut s) => {
                let mut b = [0u8; 1];
                s.read(&mut b).await.map(|_| ()).map_err(|e| e.to_string())
            }
            Err(e) => Err(ferry_mover::session::error_chain(&e)),
        }
    });
    let wrong = mixed.files_as(Role::Sender, "transfer-b");
    let client = rustls::ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyServer))
        .with_client_auth_cert(wrong.chain.clone(), wrong.key.clone_key())
        .unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("x.invalid").unwrap();
    if let Ok(mut s) = tokio_rustls::TlsConnector::from(Arc::new(client))
        .connect(name, tcp)
        .await
    {
        let _ = s.write_all(b"x").await;
        let mut b = [0u8; 1];
        let _ = s.read(&mut b).await;
    }
    let err = srv.await.unwrap().unwrap_err();
    assert!(
        err.contains("urn:ferry:transfer:transfer-b:role:sender"),
        "{err}"
    );
    assert!(
        err.contains("urn:ferry:transfer:transfer-a:role:receiver"),
        "{err}"
    );
}

/// What a malicious client would do: accept any server certificate.
#[derive(Debug)]
struct AcceptAnyServer;

impl rustls::client::danger::ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::aws_lc_rs::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// One CA; the receiver leaf for `ta`, the sender leaf for `tb`.
fn mixed_pki(ta: &str, tb: &str) -> Pki {
    let p = pki(ta);
    let ca = net::Ca::new("shared", 1).unwrap();
    std::fs::write(p.path.join("ca.crt"), ca.cert_pem()).unwrap();
    for (role, t) in [(Role::Receiver, ta), (Role::Sender, tb)] {
        let (cert, key) = ca.issue(t, role).unwrap();
        std::fs::write(p.path.join(format!("{role}.crt")), cert).unwrap();
        std::fs::write(p.path.join(format!("{role}.key")), key).unwrap();
    }
    p
}

#[tokio::test]
async fn sender_certificate_used_as_server_is_refused() {
    let p = pki("roles");
    // A "receiver" that presents the sender's certificate.
    let (_srv, cli) = handshake(
        &p.files(Role::Sender),
        &[Role::Sender],
        &p.files(Role::Sender),
        &[Role::Receiver],
    )
    .await;
    let err = cli.unwrap_err();
    assert!(
        err.contains("urn:ferry:transfer:roles:role:sender"),
        "{err}"
    );
    assert!(err.contains("role:receiver"), "{err}");
}

#[tokio::test]
async fn silent_client_is_cut_off_by_the_handshake_timeout() {
    let p = pki("silent");
    let dst = tempfile::tempdir().unwrap();
    let (addr, recv) = start_receiver(&p, dst.path()).await;
    let started = Instant::now();
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut b = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut b))
        .await
        .expect("receiver kept a silent connection open past its deadline");
    assert!(
        matches!(n, Ok(0) | Err(_)),
        "server sent data to an unauthenticated peer"
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2),
        "closed too early: {waited:?}"
    );
    // The receiver is still serving: a real sender gets through afterwards.
    let src = tempfile::tempdir().unwrap();
    write(&src.path().join("a"), b"still alive");
    send(&p, src.path(), addr, &SendOpts::default())
        .await
        .unwrap();
    recv.await.unwrap().unwrap();
    assert_eq!(std::fs::read(dst.path().join("a")).unwrap(), b"still alive");
}

#[tokio::test]
async fn tls_client_that_never_sends_hello_is_cut_off() {
    let p = pki("nohello");
    let dst = tempfile::tempdir().unwrap();
    let (addr, _recv) = start_receiver(&p, dst.path()).await;
    let client = Arc::new(net::client_config(&p.files(Role::Sender), &[Role::Receiver]).unwrap());
    let mut s = net::connect_tls(addr, client, Duration::from_secs(5))
        .await
        .unwrap();
    let mut b = [0u8; 16];
    let r = tokio::time::timeout(Duration::from_secs(10), s.read(&mut b))
        .await
        .expect("receiver waited forever for Hello");
    assert!(matches!(r, Ok(0) | Err(_)));
}

#[tokio::test]
async fn progress_service_serves_operators_and_refuses_senders() {
    let p = pki("prog");
    let recv_files = p.files(Role::Receiver);
    let progress = Arc::new(Progress::new("prog", "receiver"));
    progress.set_phase(Phase::Transferring);
    progress
        .bytes_done
        .store(1234, std::sync::atomic::Ordering::Relaxed);
    let tls = Arc::new(net::server_config(&recv_files, &[Role::Operator]).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve_progress(listener, tls, progress.clone()));

    let op = Arc::new(
        net::client_config(&p.files(Role::Operator), &[Role::Sender, Role::Receiver]).unwrap(),
    );
    let mut client = connect_progress(addr, op).await.unwrap();
    let got = client
        .get(ferry_proto::progress::v1::ProgressRequest { interval_ms: 100 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.bytes_done, 1234);
    assert_eq!(got.role, "receiver");
    assert_eq!(got.transfer_id, "prog");

    let mut stream = client
        .watch(ferry_proto::progress::v1::ProgressRequest { interval_ms: 100 })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.bytes_done, 1234);
    progress
        .bytes_done
        .store(5000, std::sync::atomic::Ordering::Relaxed);
    progress.set_phase(Phase::Succeeded);
    let mut last = first;
    while let Some(u) = stream.message().await.unwrap() {
        last = u;
    }
    assert_eq!(last.bytes_done, 5000);
    assert_eq!(
        last.phase,
        ferry_proto::progress::v1::Phase::Succeeded as i32
    );

    let sender = Arc::new(
        net::client_config(&p.files(Role::Sender), &[Role::Sender, Role::Receiver]).unwrap(),
    );
    let refused = async {
        let mut c = connect_progress(addr, sender)
            .await
            .map_err(|e| e.to_string())?;
        c.get(ferry_proto::progress::v1::ProgressRequest { interval_ms: 100 })
            .await
            .map_err(|e| e.to_string())
    }
    .await;
    assert!(
        refused.is_err(),
        "a sender certificate read the progress port"
    );
}

/// Operator-issued certificates name the cluster and the attempt: a sender holding the
/// certificate of an earlier attempt (or one minted for another cluster) is refused by the
/// receiver of the current attempt, though all chain to the same CA.
#[tokio::test]
async fn certificate_of_an_earlier_attempt_or_another_cluster_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = net::Ca::new("cluster east", 1).unwrap();
    std::fs::write(dir.path().join("ca.crt"), ca.cert_pem()).unwrap();
    let files = |name: &str, role: Role, cluster: &str, attempt: u32| {
        let id = net::Identity::scoped("uid.1", role, cluster, attempt).unwrap();
        let (cert, key) = ca.issue_for(&id).unwrap();
        let (c, k) = (
            dir.path().join(format!("{name}.crt")),
            dir.path().join(format!("{name}.key")),
        );
        std::fs::write(&c, cert).unwrap();
        std::fs::write(&k, key).unwrap();
        net::load_files(&dir.path().join("ca.crt"), &c, &k, "uid.1", role).unwrap()
    };
    let receiver = files("r2", Role::Receiver, "east", 2);
    let current = files("s2", Role::Sender, "east", 2);
    // (The client side may see the server's close without close_notify; the server's verdict on
    // the client certificate is what counts.)
    let (srv, _) = handshake(&receiver, &[Role::Sender], &current, &[Role::Receiver]).await;
    assert!(srv.is_ok(), "same attempt refused: {srv:?}");
    for (name, cluster, attempt) in [("s1", "east", 1), ("sw", "west", 2)] {
        let stale = files(name, Role::Sender, cluster, attempt);
        let (srv, cli) = handshake(&receiver, &[Role::Sender], &stale, &[Role::Receiver]).await;
        assert!(srv.is_err(), "{name}: the receiver accepted it");
        // Each side refuses the other; the stale sender's own error names both identities.
        let err = format!("{srv:?} {cli:?}");
        let stale_uri =
            format!("urn:ferry:cluster:{cluster}:transfer:uid.1:attempt:{attempt}:role:sender");
        assert!(err.contains(&stale_uri), "{name}: {err}");
        assert!(err.contains(":attempt:2:role:receiver"), "{name}: {err}");
    }
}
