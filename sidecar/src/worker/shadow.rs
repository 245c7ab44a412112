//! A shadow placement yields to its champion: it runs a batch of sampled copies only while the
//! champion's consumer (`task_<task>` on `TASKS`) holds nothing undelivered and nothing in
//! flight, so on shared cores the shadow spends time the champion is not using. Copies that
//! wait past their deadline (the gateway gives them a short one) are shed by the caller.
//!
//! The champion's state is JetStream's own count, read at most every [`POLL`]: it covers every
//! worker of the champion, wherever it runs, not just this one.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream::Stream};

use crate::{contract, nats};

/// How often the champion's consumer is read while shadow copies wait.
pub const POLL: Duration = Duration::from_millis(20);

/// The most tokens of one shadow batch (a few sampled copies). The gate keeps a shadow batch
/// from *starting* while the champion works, but a started one runs to its end: on shared
/// cores a batch of 13 copies (~3,000 tokens, 1.2-2.3 s of MiniLM on 2 cores) held the CPU
/// when the next champion request arrived (reports/production/production.md).
pub const MAX_BATCH_TOKENS: usize = 512;

/// A loop's batch budget: a shadow's is cut to [`MAX_BATCH_TOKENS`] (its first copy still
/// runs whole, however long), a champion's is what its placement's limits say.
pub fn batch_budget(budget: usize, shadow: bool) -> usize {
    if shadow {
        budget.min(MAX_BATCH_TOKENS)
    } else {
        budget
    }
}

pub struct ChampionGate {
    js: jetstream::Context,
    consumer: String,
    stream: Option<Stream>,
    last: Option<(Instant, bool)>,
}

impl ChampionGate {
    pub fn new(js: jetstream::Context, task: &str) -> Self {
        Self {
            js,
            consumer: contract::declared().nats.task_consumer.name(task),
            stream: None,
            last: None,
        }
    }

    /// Whether the champion is idle now (a reading at most [`POLL`] old). A task whose
    /// consumer does not exist has no champion traffic: idle. A reading that fails counts
    /// as busy: the shadow must never be the reason champion work waits.
    pub async fn champion_idle(&mut self) -> bool {
        if let Some((at, idle)) = self.last {
            if at.elapsed() < POLL {
                return idle;
            }
        }
        let idle = self.read().await;
        self.last = Some((Instant::now(), idle));
        idle
    }

    async fn read(&mut self) -> bool {
        if self.stream.is_none() {
            match nats::tasks_stream(&self.js).await {
                Ok(stream) => self.stream = Some(stream),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot open TASKS for the shadow gate");
                    return false;
                }
            }
        }
        let Some(stream) = self.stream.as_ref() else {
            return false;
        };
        match stream.consumer_info(&self.consumer).await {
            Ok(info) => info.num_pending == 0 && info.num_ack_pending == 0,
            Err(e) if e.to_string().contains("not found") => true,
            Err(e) => {
                tracing::debug!(consumer = %self.consumer, error = %e, "champion state unreadable");
                self.stream = None;
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shadow_batch_is_small_and_a_champion_keeps_its_budget() {
        assert_eq!(batch_budget(32_768, true), MAX_BATCH_TOKENS);
        assert_eq!(batch_budget(256, true), 256);
        assert_eq!(batch_budget(32_768, false), 32_768);
    }
}
