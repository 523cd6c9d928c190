//! Decodes arbitrary bytes as the node service's `Take` and `Put` requests (a hostile tenant's
//! receiver may send anything) and runs the checks the service applies before touching the store.
//! Must never panic; what is accepted is bounded and well formed.
#![no_main]

use ferry_mover::node::MAX_TAKE;
use ferry_mover::node::service::{MAX_TAKE_WAIT, parse_put, parse_take};
use ferry_proto::blockstore::v1 as pb;
use libfuzzer_sys::fuzz_target;
use prost::Message as _;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = pb::TakeRequest::decode(data)
        && let Ok((_, announced, wait)) = parse_take(&req)
    {
        assert!(announced.len() <= MAX_TAKE);
        assert!(wait <= MAX_TAKE_WAIT);
        assert_eq!(announced.len(), req.blocks.len());
        for (i, a) in announced.iter().enumerate() {
            assert_eq!(a.index, i as u64);
            assert_eq!(a.hash.as_bytes().as_slice(), req.blocks[i].hash.as_slice());
        }
    }
    if let Ok(req) = pb::PutRequest::decode(data)
        && let Ok(hash) = parse_put(&req)
    {
        assert_eq!(hash.as_bytes().as_slice(), req.hash.as_slice());
        assert!(ferry_mover::cas::storable(req.data.len()));
    }
});
