//! A fan-out's late blocks (refetch capability, docs/protocol.md): once every stream's data is
//! in, stream 0 asks the sender for the blocks this receiver had left to a fellow destination
//! that failed before delivering them (blocks, and with the packs capability packs of small
//! files), so the failure costs this destination no retry.

use std::collections::HashMap;
use std::sync::Arc;

use ferry_proto::wire::v1 as pb;
use tokio::io::{AsyncRead, AsyncWrite};

use super::ReceiveError;
use super::effects::{self, Session};
use super::state::SenderViolation;
use crate::node::swarm::Orphans;
use crate::session::framed::{FrameReader, FrameWriter};
use crate::tree::peer_path::PeerPath;
use crate::wire::Message;

/// Blocks per Refetch. The next is sent once these arrived, so a file's outstanding blocks stay
/// far below the receiver's limit on a file's gaps however scattered the failed peer's share.
pub(super) const REFETCH_BLOCKS: usize = 1024;

/// Asks the sender for every orphaned block, a Refetch at a time, and writes each as it arrives;
/// then sends the empty Refetch that lets the sender go on.
pub(super) async fn ask_sender<R, W>(
    shared: &Arc<Session>,
    reader: &mut FrameReader<R>,
    writer: &mut FrameWriter<W>,
    orphans: Vec<Orphans>,
) -> Result<(), ReceiveError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    for o in orphans {
        let file_id = o.sink.file_id();
        if let Some(paths) = o.sink.pack_paths() {
            for b in &o.blocks {
                ask_for_pack(shared, reader, writer, file_id, paths, b.hash.as_bytes()).await?;
            }
            continue;
        }
        for chunk in o.blocks.chunks(REFETCH_BLOCKS) {
            shared
                .state()?
                .need_again(file_id, chunk.iter().map(|b| b.index))?;
            writer
                .send(&Message::Refetch(pb::Refetch {
                    file_id,
                    path: o.sink.path().to_vec(),
                    indexes: chunk.iter().map(|b| b.index).collect(),
                    hashes: chunk.iter().map(|b| b.hash.as_bytes().to_vec()).collect(),
                    pack: None,
                }))
                .await?;
            writer.flush().await?;
            let mut left: HashMap<u64, [u8; 32]> = chunk
                .iter()
                .map(|b| (b.index, *b.hash.as_bytes()))
                .collect();
            while !left.is_empty() {
                match next_owed(shared, reader).await? {
                    Message::Block { header, data } => {
                        // Only a block this Refetch named, with the hash announced for it.
                        let asked = header.file_id == file_id
                            && left
                                .remove(&header.index)
                                .is_some_and(|h| h.as_slice() == header.hash.as_slice());
                        if !asked {
                            return Err(SenderViolation::NotRefetched {
                                path: String::from_utf8_lossy(o.sink.path()).into_owned(),
                                index: header.index,
                            }
                            .into());
                        }
                        let sh = shared.clone();
                        shared
                            .blocking
                            .run(move || effects::handle_block(&sh, &header, &data))
                            .await??;
                    }
                    other => return Err(out_of_order(&other, "while refetched blocks are owed")),
                }
            }
        }
    }
    writer
        .send(&Message::Refetch(pb::Refetch::default()))
        .await?;
    writer.flush().await?;
    Ok(())
}

/// Asks the sender for one pack (its files' paths and announced hash) and writes it once its
/// Pack frame came; nothing else may come meanwhile.
async fn ask_for_pack<R, W>(
    shared: &Arc<Session>,
    reader: &mut FrameReader<R>,
    writer: &mut FrameWriter<W>,
    pack_id: u64,
    paths: &[PeerPath],
    hash: &[u8; 32],
) -> Result<(), ReceiveError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    shared.state()?.pack_on_wire(pack_id)?;
    let pack = pb::RefetchPack {
        pack_id,
        paths: paths.iter().map(|p| p.as_bytes().to_vec()).collect(),
        hash: hash.to_vec(),
    };
    writer
        .send(&Message::Refetch(pb::Refetch {
            pack: Some(pack),
            ..Default::default()
        }))
        .await?;
    writer.flush().await?;
    let when = "while a refetched pack is owed";
    match next_owed(shared, reader).await? {
        // The state takes only this pack, with its announced length and hash.
        Message::Pack { header, data } if header.pack_id == pack_id => {
            let sh = shared.clone();
            shared
                .blocking
                .run(move || super::packs::handle_pack(&sh, &header, &data))
                .await?
        }
        other => Err(out_of_order(&other, when)),
    }
}

/// The sender's next frame while refetched data is owed, past Keepalive and Busy frames; its
/// Error frame ends the session.
async fn next_owed<R: AsyncRead + Unpin>(
    shared: &Session,
    reader: &mut FrameReader<R>,
) -> Result<Message, ReceiveError> {
    loop {
        let msg = reader.expect().await?;
        shared.saw(&msg);
        match msg {
            Message::Keepalive | Message::Busy(_) => {}
            Message::Error(e) => return Err(ReceiveError::from_peer(e)),
            m => return Ok(m),
        }
    }
}

fn out_of_order(msg: &Message, when: &'static str) -> ReceiveError {
    SenderViolation::OutOfOrder {
        stream: 0,
        kind: msg.frame_type(),
        when,
    }
    .into()
}
