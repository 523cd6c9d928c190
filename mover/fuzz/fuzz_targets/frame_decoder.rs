//! Feeds arbitrary bytes to the frame decoder, in arbitrary chunkings, and decodes every frame's
//! message body. Must never panic, and never reserve more than one capped frame.
#![no_main]

use bytes::BytesMut;
use ferry_mover::wire::{FRAME_HEADER_LEN, MAX_FRAME_PAYLOAD, Message, decode_frame};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // First byte picks the chunk size, so partial frames get exercised too.
    let Some((&chunk, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut buf = BytesMut::new();
    for piece in rest.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            match decode_frame(&mut buf) {
                Ok(Some(frame)) => {
                    assert!(frame.payload.len() <= MAX_FRAME_PAYLOAD as usize);
                    let _ = Message::decode(frame);
                }
                Ok(None) => {
                    assert!(buf.capacity() <= FRAME_HEADER_LEN + MAX_FRAME_PAYLOAD as usize + (1 << 20));
                    break;
                }
                Err(_) => return,
            }
        }
    }
});
