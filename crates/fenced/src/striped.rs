//! Segmented (striped) locks for hot resources.

use crate::client::Client;
use crate::error::{Error, Result};
use crate::lock::Lock;
use crate::name::{LockName, MAX_NAME_LEN};
use crate::spi::codec::Fnv1a;
use std::hash::{Hash, Hasher};

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

    /// The segment index for `key`: stable across processes and builds.
    pub fn index_for<K: Hash + ?Sized>(&self, key: &K) -> u32 {
        let mut h = Fnv1a::default();
        key.hash(&mut h);
        (h.finish() % u64::from(self.segments)) as u32
    }

    /// The mutex of the segment `key` maps to.
    pub fn for_key<K: Hash + ?Sized>(&self, key: &K) -> crate::Mutex {
        let name = LockName::new(&self.segment_name(self.index_for(key)))
            .expect("segment names were checked when the striped lock was made");
        crate::Mutex::new(Lock::new(self.client.clone(), name, crate::Mode::Exclusive))
    }
}

fn segment_name(name: &str, index: u32) -> String {
    format!("{name}:seg:{index}")
}
