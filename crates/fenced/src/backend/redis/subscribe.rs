//! One pub/sub connection per client, shared by every waiter: a release
//! publishes on the lock's channel, or on the queue head owner's own
//! channel beside it, and the message bumps the name's [`Wakeups`]: every
//! waiter, or only the one whose queue ticket the message names. Channels
//! are subscribed the first time a name is waited on and dropped once many
//! names have no waiter left.
//!
//! If the connection drops, or the sentinels announce a new master, every
//! waiter is woken to try again (a message may have been lost) and the
//! next wait connects again.

use super::conn::Node;
use crate::error::Result;
use crate::spi::wake::Wakeups;
use futures_util::StreamExt;
use redis::aio::PubSubSink;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Subscriptions kept before idle ones are dropped.
const SWEEP_AT: usize = 1024;

type Channels = Arc<Mutex<HashMap<String, Arc<str>>>>;

pub(super) struct Subscriber {
    wakeups: Arc<Wakeups>,
    sink: Arc<tokio::sync::Mutex<Option<PubSubSink>>>,
    channels: Channels,
    reader: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        if let Some(r) = unpoisoned(&self.reader).take() {
            r.abort();
        }
    }
}

impl Subscriber {
    pub(super) fn new(wakeups: Arc<Wakeups>) -> Subscriber {
        Subscriber {
            wakeups,
            sink: Default::default(),
            channels: Default::default(),
            reader: Mutex::new(None),
        }
    }

    /// Those of `channels` not subscribed yet.
    fn missing(&self, channels: &[String]) -> Vec<String> {
        let known = unpoisoned(&self.channels);
        channels
            .iter()
            .filter(|c| !known.contains_key(c.as_str()))
            .cloned()
            .collect()
    }

    /// Makes sure messages on `channels` (the lock's, and the waiting
    /// owner's own) wake the waiters of `name`, in one `SUBSCRIBE`.
    /// Returns `true` if this call subscribed (the caller must look at the
    /// lock again: a release may have come before the subscription).
    pub(super) async fn ensure(
        &self,
        node: &Node,
        channels: &[String],
        name: &str,
    ) -> Result<bool> {
        if self.missing(channels).is_empty() {
            return Ok(false);
        }
        let mut sink = self.sink.lock().await;
        let channels = self.missing(channels);
        if channels.is_empty() {
            return Ok(false);
        }
        if sink.is_none() {
            // Marked seen before connecting: a switch during it connects again.
            let mut switches = node.switches();
            if let Some(s) = &mut switches {
                s.borrow_and_update();
            }
            let pubsub = node.pubsub().await.map_err(|e| node.error(e))?;
            let (s, stream) = pubsub.split();
            *sink = Some(s);
            let task = tokio::spawn(read(
                stream,
                self.channels.clone(),
                self.sink.clone(),
                self.wakeups.clone(),
                switches,
            ));
            if let Some(old) = unpoisoned(&self.reader).replace(task.abort_handle()) {
                old.abort();
            }
        }
        let s = sink.as_mut().expect("connected above");
        if let Err(e) = s.subscribe(&channels).await {
            *sink = None;
            return Err(node.error(e));
        }
        let idle: Vec<String> = {
            let mut known = unpoisoned(&self.channels);
            for c in channels {
                known.insert(c, name.into());
            }
            if known.len() < SWEEP_AT {
                Vec::new()
            } else {
                let idle: Vec<String> = known
                    .iter()
                    .filter(|(_, n)| !self.wakeups.has_interest(n))
                    .map(|(c, _)| c.clone())
                    .collect();
                for c in &idle {
                    known.remove(c);
                }
                idle
            }
        };
        if !idle.is_empty() {
            // Best effort: a failure only leaves unused subscriptions.
            let _ = s.unsubscribe(&idle).await;
        }
        Ok(true)
    }
}

async fn read(
    mut stream: redis::aio::PubSubStream,
    channels: Channels,
    sink: Arc<tokio::sync::Mutex<Option<PubSubSink>>>,
    wakeups: Arc<Wakeups>,
    mut switches: Option<tokio::sync::watch::Receiver<u64>>,
) {
    loop {
        // Under Sentinel, a new master ends this connection like a drop:
        // releases now publish there.
        let msg = tokio::select! {
            m = stream.next() => m,
            () = switched(&mut switches) => None,
        };
        let Some(msg) = msg else { break };
        let name = unpoisoned(&channels).get(msg.get_channel_name()).cloned();
        // The queue's head ticket wakes that waiter alone; anything
        // else (Redisson's unlock `0`, its read-unlock `1`) wakes all.
        match (name, msg.get_payload::<i64>().ok()) {
            (Some(name), Some(ticket)) if ticket > 1 => wakeups.wake_ticket(&name, ticket),
            (Some(name), _) => wakeups.wake(&name),
            (None, _) => {}
        }
    }
    tracing::debug!("redis pub/sub connection closed or moved; waiters will look again");
    *sink.lock().await = None;
    let names: Vec<Arc<str>> = unpoisoned(&channels).drain().map(|(_, n)| n).collect();
    for n in names {
        wakeups.wake(&n);
    }
}

/// Resolves when the sentinels announce a new master; never without them.
async fn switched(switches: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    if let Some(s) = switches
        && s.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

use crate::spi::sync::unpoisoned;
