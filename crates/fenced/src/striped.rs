//! Segmented (striped) locks for hot resources.

use crate::client::Client;
use crate::error::{Error, Result};
use crate::lock::Lock;
use crate::name::{LockName, MAX_NAME_LEN};
use crate::spi::codec::Fnv1a;
use std::hash::Hasher;

/// The most segments a striped lock may have.
pub const MAX_SEGMENTS: u32 = 65_536;

/// `segments` independent mutexes over one hot resource, named
/// `<name>:seg:<i>`: the seeds' flash-sale trick of splitting one stock of
/// N items into K stocks, each with its own lock, so K buyers can proceed
/// at once.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let client = fenced::Client::connect("memory://").await?;
/// let stock = client.striped("sku-42", 10)?;
/// assert_eq!(stock.segment(3)?.name(), "sku-42:seg:3");
/// // A key always maps to the same segment:
/// assert_eq!(stock.for_key("user-7").name(), stock.for_key("user-7").name());
/// # Ok::<_, fenced::Error>(()) }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct StripedLock {
    client: Client,
    name: String,
    segments: u32,
}

impl StripedLock {
    pub(crate) fn new(client: Client, name: &str, segments: u32) -> Result<Self> {
        if segments == 0 || segments > MAX_SEGMENTS {
            return Err(Error::invalid(format!(
                "striped lock {name:?} needs 1 to {MAX_SEGMENTS} segments, not {segments}"
            )));
        }
        // The longest segment name must be valid too.
        let longest = segment_name(name, segments - 1);
        if longest.len() > MAX_NAME_LEN {
            return Err(Error::invalid(format!(
                "striped lock name {name:?} is too long: its segment names would pass \
                 {MAX_NAME_LEN} bytes"
            )));
        }
        LockName::new(&longest)?;
        Ok(StripedLock {
            client,
            name: name.to_owned(),
            segments,
        })
    }

    /// How many segments.
    pub fn segments(&self) -> u32 {
        self.segments
    }

    /// The name of segment `index`.
    pub fn segment_name(&self, index: u32) -> String {
        segment_name(&self.name, index)
    }

    /// The mutex of segment `index` (0-based).
    pub fn segment(&self, index: u32) -> Result<crate::Mutex> {
        if index >= self.segments {
            return Err(Error::invalid(format!(
                "segment {index} is out of range: {:?} has {} segments",
                self.name, self.segments
            )));
        }
        self.client.mutex(&self.segment_name(index))
    }

    /// The segment index for `key`: the 64-bit FNV-1a hash of its bytes,
    /// modulo the number of segments. The same in every process, build,
    /// platform and release of fenced, and easy to compute in any language.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let client = fenced::Client::connect("memory://").await?;
    /// let stock = client.striped("sku-42", 10)?;
    /// // FNV-1a of "user-7" is 0xf84ba0aa754a486e, 17891570598632114286.
    /// assert_eq!(stock.index_for("user-7"), 6);
    /// # Ok::<_, fenced::Error>(()) }).unwrap();
    /// ```
    pub fn index_for(&self, key: impl AsRef<[u8]>) -> u32 {
        (fnv1a(key.as_ref()) % u64::from(self.segments)) as u32
    }

    /// The mutex of the segment `key` maps to ([`index_for`](Self::index_for)).
    pub fn for_key(&self, key: impl AsRef<[u8]>) -> crate::Mutex {
        let name = LockName::new(&self.segment_name(self.index_for(key)))
            .expect("segment names were checked when the striped lock was made");
        crate::Mutex::new(Lock::new(self.client.clone(), name, crate::Mode::Exclusive))
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = Fnv1a::default();
    h.write(bytes);
    h.finish()
}

fn segment_name(name: &str, index: u32) -> String {
    format!("{name}:seg:{index}")
}

#[cfg(test)]
mod tests {
    use super::fnv1a;

    /// The published FNV-1a 64 vectors (and two of ours): a change of hash
    /// would move every key of every running service to another segment.
    #[test]
    fn the_segment_hash_is_fnv1a_64_of_the_bytes() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(fnv1a(b"user-7"), 0xf84b_a0aa_754a_486e);
    }
}
