//! The fuzzer's bytes read as small numbers and short slices, shared by the targets that drive a
//! protocol state with message sequences (`#[path]`-included, not a target of its own).

pub struct Input<'a>(pub &'a [u8]);

#[allow(dead_code)] // each target uses the readers it needs
impl Input<'_> {
    pub fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    pub fn small(&mut self, below: u64) -> Option<u64> {
        Some(u64::from(self.byte()?) % below.max(1))
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.0.len());
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        b.to_vec()
    }
}
