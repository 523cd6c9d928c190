//! Proof of possession: a sender must show it holds a block's bytes, not just its hash, before the
//! receiver materialises that block from its store.
//!
//! The receiver picks a fresh random [`Nonce`] per transfer. For a block the sender wants served
//! from the store it sends `keyed_hash(derive_key(CONTEXT, nonce), secret)` with
//! `secret = derive_key(SECRET_CONTEXT, block_bytes)` (a second hash of the whole block, which the
//! block's name does not reveal); the receiver computes the same from the secret it stored beside
//! the block when it was inserted and compares. So checking a proof reads no block: a wrong
//! proof costs the same whether or not the store holds the block, and changes nothing. The key is unknown before the
//! nonce is, so proofs cannot be precomputed or replayed across transfers, and computing one needs
//! every byte of the block: a hash alone (which may have leaked, or been guessed from a public
//! file) is never enough to read another tenant's data out of a shared store.

/// Domain separation for the key derivation, so these keys can never collide with another use of
/// BLAKE3 keyed hashing in ferry.
const CONTEXT: &str = "ferry.dev 2026-11 cas proof-of-possession v2";
/// Domain separation for a block's possession secret.
const SECRET_CONTEXT: &str = "ferry.dev 2026-11 cas possession secret v2";

/// What proves possession of a block: derived from all of its bytes, kept by the store beside
/// the block, never sent.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Secret(pub [u8; 32]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// The possession secret of `block`.
pub fn secret_of(block: &[u8]) -> Secret {
    Secret(blake3::derive_key(SECRET_CONTEXT, block))
}

/// A receiver-chosen random challenge, one per transfer.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Nonce(pub [u8; 32]);

/// A sender's answer for one block under one nonce.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Proof(pub [u8; 32]);

impl std::fmt::Debug for Nonce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The nonce is not secret once sent, but keeping it out of logs costs nothing.
        f.write_str("Nonce(..)")
    }
}

/// The key derived from a nonce: derive once per transfer, then prove or check many blocks.
#[derive(Clone)]
pub struct PopKey([u8; 32]);

impl PopKey {
    pub fn derive(nonce: &Nonce) -> Self {
        Self(blake3::derive_key(CONTEXT, &nonce.0))
    }

    /// A key a receiver handed over (to its node service, which checks proofs for it).
    pub fn from_bytes(key: [u8; 32]) -> Self {
        Self(key)
    }

    pub fn to_bytes(&self) -> [u8; 32] {
        self.0
    }

    pub fn prove(&self, block: &[u8]) -> Proof {
        self.prove_secret(&secret_of(block))
    }

    pub fn prove_secret(&self, secret: &Secret) -> Proof {
        Proof(*blake3::keyed_hash(&self.0, &secret.0).as_bytes())
    }

    /// Does `proof` match these stored bytes?
    pub fn verify(&self, stored_block: &[u8], proof: &Proof) -> bool {
        self.verify_secret(&secret_of(stored_block), proof)
    }

    /// Does `proof` match the stored secret? Constant-time comparison (`blake3::Hash`'s
    /// equality is constant-time), and the same work whatever the inputs.
    pub fn verify_secret(&self, secret: &Secret, proof: &Proof) -> bool {
        blake3::keyed_hash(&self.0, &secret.0) == blake3::Hash::from_bytes(proof.0)
    }
}

/// A fresh random nonce from the thread-local CSPRNG (seeded by the OS).
pub fn challenge() -> Nonce {
    Nonce(rand::random())
}

/// The sender's side: the proof for `block` under `nonce`.
pub fn prove(nonce: &Nonce, block: &[u8]) -> Proof {
    PopKey::derive(nonce).prove(block)
}

/// The receiver's side: does `proof` match the bytes the store holds?
pub fn verify(nonce: &Nonce, stored_block: &[u8], proof: &Proof) -> bool {
    PopKey::derive(nonce).verify(stored_block, proof)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proof_from_the_bytes_verifies() {
        let nonce = challenge();
        let block = vec![7u8; 4096];
        let proof = prove(&nonce, &block);
        assert!(verify(&nonce, &block, &proof));
    }

    #[test]
    fn knowing_only_the_hash_is_not_a_proof() {
        let nonce = challenge();
        let block = b"tenant A's secret weights".repeat(100);
        // What an attacker who knows the content hash could send.
        let hash_as_proof = Proof(*blake3::hash(&block).as_bytes());
        assert!(!verify(&nonce, &block, &hash_as_proof));
        // A plain keyed hash under the raw nonce (without the derivation) is not accepted either.
        let raw = Proof(*blake3::keyed_hash(&nonce.0, &block).as_bytes());
        assert!(!verify(&nonce, &block, &raw));
    }

    #[test]
    fn proof_is_bound_to_nonce_and_content() {
        let a = challenge();
        let b = challenge();
        assert_ne!(a, b, "two challenges must differ");
        let block = vec![1u8; 1 << 20];
        let proof = prove(&a, &block);
        assert!(
            !verify(&b, &block, &proof),
            "a proof must not replay under another nonce"
        );
        let mut flipped = block.clone();
        flipped[12345] ^= 1;
        assert!(
            !verify(&a, &flipped, &proof),
            "a proof must not match other content"
        );
        let key = PopKey::derive(&a);
        assert_eq!(key.prove(&block), proof);
        assert!(key.verify(&block, &proof));
    }
}
