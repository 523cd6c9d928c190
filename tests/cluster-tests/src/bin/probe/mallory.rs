//! `mallory`: a tenant that turned its own receiver's certificate against a node service. For
//! as long as it runs it keeps, against one service:
//! - Takes of its own blocks that it never reads (as many as the service lets it open);
//! - Puts sent all but their last KiB and then held, over fresh connections;
//! - probes: Takes with wrong proofs of hashes another tenant's node holds and of hashes no
//!   node holds, timed.
//!
//! It prints one JSON line at the end: what it could open, and the probes' replies and medians.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ferry_mover::cas::pop::{Nonce, PopKey};
use ferry_mover::cas::{BLOCK_SIZE, BlockHash};
use ferry_mover::net::{self, Role};
use ferry_proto::blockstore::v1 as pb;
use ferry_proto::blockstore::v1::block_store_client::BlockStoreClient;
use prost::Message as _;

type Client = BlockStoreClient<tonic::transport::Channel>;

pub struct Plan {
    pub service: SocketAddr,
    pub certs: std::path::PathBuf,
    pub transfer_id: String,
    pub seconds: u64,
    /// Hashes (hex) of blocks another tenant stored: what a prober would like to confirm.
    pub present: Vec<String>,
}

fn block(seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; BLOCK_SIZE];
    let mut h = blake3::Hasher::new();
    h.update(&seed.to_le_bytes());
    h.finalize_xof().fill(&mut out);
    out
}

fn files(certs: &Path, transfer_id: &str) -> anyhow::Result<net::TlsFiles> {
    Ok(net::load_files(
        &certs.join("ca.crt"),
        &certs.join("receiver.crt"),
        &certs.join("receiver.key"),
        transfer_id,
        Role::Receiver,
    )?)
}

async fn client(plan: &Plan) -> anyhow::Result<Client> {
    let tls = Arc::new(net::node_client_config(&files(
        &plan.certs,
        &plan.transfer_id,
    )?)?);
    let channel = net::tls_channel(plan.service, tls, |e| e)
        .await
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(BlockStoreClient::new(channel)
        .max_decoding_message_size(ferry_mover::node::MAX_MESSAGE)
        .max_encoding_message_size(ferry_mover::node::MAX_MESSAGE))
}

fn take_of(key: &PopKey, hashes: &[[u8; 32]], proofs: &[[u8; 32]]) -> pb::TakeRequest {
    pb::TakeRequest {
        pop_key: key.to_bytes().to_vec(),
        blocks: hashes
            .iter()
            .zip(proofs)
            .map(|(h, p)| pb::AnnouncedBlock {
                hash: h.to_vec(),
                proof: p.to_vec(),
            })
            .collect(),
        wait_ms: 0,
        pieces: false,
    }
}

/// Keeps Takes of its own blocks open and unread; returns how many it opened in all.
async fn stall(plan: &Plan, until: Instant) -> u64 {
    let Ok(mut c) = client(plan).await else {
        return 0;
    };
    let mut own = Vec::new();
    for i in 0..8 {
        let b = block(1_000 + i);
        let put = c
            .put(pb::PutRequest {
                hash: BlockHash::of(&b).as_bytes().to_vec(),
                data: b.clone().into(),
            })
            .await;
        if put.is_ok() {
            own.push(b);
        }
    }
    let key = PopKey::derive(&Nonce([9; 32]));
    let hashes: Vec<[u8; 32]> = own.iter().map(|b| *BlockHash::of(b).as_bytes()).collect();
    let proofs: Vec<[u8; 32]> = own.iter().map(|b| key.prove(b).0).collect();
    let mut opened = 0;
    let mut held = Vec::new();
    while Instant::now() < until && !hashes.is_empty() {
        // Opens until refused, holds what it got, and opens again once the service dropped them.
        match tokio::time::timeout(
            Duration::from_secs(2),
            c.take(take_of(&key, &hashes, &proofs)),
        )
        .await
        {
            Ok(Ok(stream)) => {
                opened += 1;
                held.push(stream);
                if held.len() > 32 {
                    held.remove(0);
                }
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    opened
}

/// Opens connections with Puts held just short of their end; returns how many it opened.
async fn partial_puts(plan: &Plan, until: Instant) -> u64 {
    let mut opened = 0;
    let mut held: Vec<Box<dyn std::any::Any + Send>> = Vec::new();
    let mut seed = 50_000;
    while Instant::now() < until {
        let Ok(files) = files(&plan.certs, &plan.transfer_id) else {
            return opened;
        };
        let Ok(tls) = net::node_client_config(&files) else {
            return opened;
        };
        let io = match net::connect_tls_probed(plan.service, Arc::new(tls), Duration::from_secs(5))
            .await
        {
            Ok(io) => io,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let Ok((mut send, conn)) = h2::client::Builder::new()
            .initial_window_size(1 << 20)
            .handshake::<_, bytes::Bytes>(io)
            .await
        else {
            continue;
        };
        tokio::spawn(conn);
        for _ in 0..16 {
            let Ok(Ok(ready)) =
                tokio::time::timeout(Duration::from_secs(1), send.clone().ready()).await
            else {
                break;
            };
            send = ready;
            seed += 1;
            let b = block(seed);
            let msg = pb::PutRequest {
                hash: BlockHash::of(&b).as_bytes().to_vec(),
                data: b.into(),
            }
            .encode_to_vec();
            let mut frame = vec![0u8];
            frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
            frame.extend_from_slice(&msg[..msg.len() - 1024]);
            let Ok(req) =
                http::Request::post("http://ferry.invalid/ferry.blockstore.v1.BlockStore/Put")
                    .header("content-type", "application/grpc")
                    .header("te", "trailers")
                    .body(())
            else {
                break;
            };
            let Ok((reply, mut stream)) = send.send_request(req, false) else {
                break;
            };
            if stream.send_data(frame.into(), false).is_err() {
                break;
            }
            opened += 1;
            held.push(Box::new((reply, stream)));
        }
        held.push(Box::new(send));
        // What the service keeps of these stays held until it drops them.
        if held.len() > 400 {
            held.drain(..200);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    opened
}

/// One probe: a Take with a wrong proof of `hash`; what it brought back and how long it took.
async fn probe(c: &mut Client, hash: [u8; 32]) -> (usize, Duration) {
    let key = PopKey::derive(&Nonce([7; 32]));
    let started = Instant::now();
    let mut got = 0;
    if let Ok(r) = c.take(take_of(&key, &[hash], &[[0x5a; 32]])).await {
        let mut s = r.into_inner();
        while let Ok(Some(m)) = s.message().await {
            got += m.data.len();
        }
    }
    (got, started.elapsed())
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v.get(v.len() / 2).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// Probes the present and absent hashes in turn for as long as the attack lasts.
async fn probes(plan: &Plan, until: Instant) -> anyhow::Result<serde_json::Value> {
    let mut c = client(plan).await?;
    let present: Vec<[u8; 32]> = plan
        .present
        .iter()
        .map(|h| {
            let mut out = [0u8; 32];
            for (i, o) in out.iter_mut().enumerate() {
                *o = u8::from_str_radix(&h[2 * i..2 * i + 2], 16)?;
            }
            Ok(out)
        })
        .collect::<anyhow::Result<_>>()
        .context("a present hash is not 64 hex digits")?;
    let (mut held, mut absent) = (Vec::new(), Vec::new());
    let (mut held_bytes, mut absent_bytes) = (0, 0);
    let mut i = 0u64;
    while Instant::now() < until && !present.is_empty() {
        let p = present[(i as usize) % present.len()];
        let a = *BlockHash::of(&i.to_le_bytes()).as_bytes();
        // In turns first after the pause: the first request after a quiet moment is the slower
        // one for reasons of its own (wake-ups), which must not tell held from absent.
        let ((hn, ht), (an, at)) = if i.is_multiple_of(2) {
            let h = probe(&mut c, p).await;
            (h, probe(&mut c, a).await)
        } else {
            let a = probe(&mut c, a).await;
            (probe(&mut c, p).await, a)
        };
        held_bytes += hn;
        held.push(ht);
        absent_bytes += an;
        absent.push(at);
        i += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(serde_json::json!({
        "probes": held.len(),
        "held_bytes": held_bytes, "absent_bytes": absent_bytes,
        "held_ms": median(held), "absent_ms": median(absent),
    }))
}

pub async fn run(plan: Plan) -> anyhow::Result<()> {
    let until = Instant::now() + Duration::from_secs(plan.seconds);
    let (stalled, partial, probed) = tokio::join!(
        stall(&plan, until),
        partial_puts(&plan, until),
        probes(&plan, until)
    );
    let report = serde_json::json!({
        "takes_held": stalled, "partial_puts": partial, "probes": probed?,
    });
    println!("{report}");
    Ok(())
}
