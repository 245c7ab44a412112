//! Which waiting parts go into the next runtime call: a task's worker time shared fairly
//! between API keys.
//!
//! Parts wait in one queue per key (`Tf-Key`; requests without one share the queue ""), first
//! come first served within a key. A call is filled by taking, again and again, the front part
//! of the key that has had the fewest tokens of this worker's calls so far (on a tie the
//! smaller part, then the key's name), until the next one would pass the call's token budget.
//! A key that starts waiting again keeps what it was served before, but no less than the level
//! of the key last taken from (start-time fair queueing): time spent idle is no credit to spend
//! later, and a key sending small requests one after another cannot starve one that waits. A
//! key whose front part may not go now (a part of the same request is running) is passed over.
//! Tokens stand for worker time (a forward pass costs its tokens). So a key with a backlog of
//! huge requests gets the runtime one call at a time, and another key's small request waits
//! for the calls already sent to the runtime, not for the backlog.

use std::collections::{BTreeMap, HashMap, VecDeque};

/// What the queue needs to know of a waiting part.
pub trait Queued {
    /// The API key whose queue it waits in.
    fn key(&self) -> &str;
    fn tokens(&self) -> usize;
    /// One runtime call runs one op.
    fn op(&self) -> &'static str;
    /// Settled already (its request answered, handed back or failed): dropped when met.
    fn is_gone(&self) -> bool;
    /// Not to be taken now (another part of its request is running); its key waits too.
    fn is_blocked(&self) -> bool {
        false
    }
}

struct KeyQueue<T> {
    items: VecDeque<T>,
    /// Tokens of this worker's calls taken from this queue while it was waiting.
    served: u64,
}

/// Per-key queues of parts; never holds an empty queue.
pub struct FairQueue<T> {
    keys: BTreeMap<String, KeyQueue<T>>,
    /// What keys with nothing waiting had been served, while above `floor`.
    idle: HashMap<String, u64>,
    /// The served level of the key last taken from: where a newly waiting key starts.
    floor: u64,
}

impl<T: Queued> Default for FairQueue<T> {
    fn default() -> Self {
        Self {
            keys: BTreeMap::new(),
            idle: HashMap::new(),
            floor: 0,
        }
    }
}

impl<T: Queued> FairQueue<T> {
    pub fn push(&mut self, item: T) {
        if let Some(queue) = self.keys.get_mut(item.key()) {
            queue.items.push_back(item);
            return;
        }
        let served = self.idle.remove(item.key()).unwrap_or(0).max(self.floor);
        self.keys.insert(
            item.key().to_string(),
            KeyQueue {
                items: VecDeque::from([item]),
                served,
            },
        );
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Parts waiting.
    pub fn len(&self) -> usize {
        self.keys.values().map(|q| q.items.len()).sum()
    }

    /// Tokens waiting.
    pub fn tokens(&self) -> usize {
        self.iter().map(Queued::tokens).sum()
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.keys.values().flat_map(|q| q.items.iter())
    }

    /// Everything waiting, key by key.
    pub fn drain(&mut self) -> Vec<T> {
        std::mem::take(&mut self.keys)
            .into_values()
            .flat_map(|q| q.items)
            .collect()
    }

    /// Removes and returns the parts `pick` chooses; the others keep their place.
    pub fn extract(&mut self, mut pick: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut picked = Vec::new();
        for queue in self.keys.values_mut() {
            let (out, kept): (VecDeque<T>, VecDeque<T>) =
                queue.items.drain(..).partition(&mut pick);
            picked.extend(out);
            queue.items = kept;
        }
        self.retire_empty();
        picked
    }

    /// The parts of the next runtime call: at most `budget` tokens (always at least one part),
    /// one op, taken fairly between keys (see the module docs).
    pub fn take_batch(&mut self, budget: usize) -> Vec<T> {
        self.prune();
        let mut batch: Vec<T> = Vec::new();
        let mut tokens = 0;
        while let Some(key) = self.next_key(|front| match batch.first() {
            _ if front.is_blocked() => false,
            None => true,
            Some(first) => tokens + front.tokens() <= budget && front.op() == first.op(),
        }) {
            let queue = self.keys.get_mut(&key).expect("next_key names a queue");
            let item = queue.items.pop_front().expect("queues are never empty");
            self.floor = self.floor.max(queue.served);
            queue.served += item.tokens() as u64;
            tokens += item.tokens();
            batch.push(item);
            while queue.items.front().is_some_and(Queued::is_gone) {
                queue.items.pop_front();
            }
            if queue.items.is_empty() {
                let served = queue.served;
                self.keys.remove(&key);
                self.idle.insert(key, served);
            }
        }
        // A key at or below the floor would start there anyway: forget it.
        let floor = self.floor;
        self.idle.retain(|_, served| *served > floor);
        batch
    }

    /// The key to take from next among those whose front part `fits`: fewest tokens served,
    /// then the smaller front part, then the name. A key whose part does not fit this call is
    /// passed over, and so comes first in the next (it was served less).
    fn next_key(&self, fits: impl Fn(&T) -> bool) -> Option<String> {
        self.keys
            .iter()
            .filter_map(|(name, q)| q.items.front().filter(|f| fits(f)).map(|f| (name, q, f)))
            .min_by_key(|(name, q, front)| (q.served, front.tokens(), *name))
            .map(|(name, _, _)| name.clone())
    }

    /// Drops settled parts (and queues left empty).
    fn prune(&mut self) {
        for queue in self.keys.values_mut() {
            queue.items.retain(|item| !item.is_gone());
        }
        self.retire_empty();
    }

    /// Queues left empty go, remembering what their key was served.
    fn retire_empty(&mut self) {
        let empty: Vec<String> = self
            .keys
            .iter()
            .filter(|(_, q)| q.items.is_empty())
            .map(|(k, _)| k.clone())
            .collect();
        for key in empty {
            if let Some(queue) = self.keys.remove(&key) {
                self.idle.insert(key, queue.served);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct Item {
        key: &'static str,
        tokens: usize,
        id: u32,
        gone: bool,
    }

    impl Queued for Item {
        fn key(&self) -> &str {
            self.key
        }
        fn tokens(&self) -> usize {
            self.tokens
        }
        fn op(&self) -> &'static str {
            "embed"
        }
        fn is_gone(&self) -> bool {
            self.gone
        }
        fn is_blocked(&self) -> bool {
            self.id >= 9000
        }
    }

    fn item(key: &'static str, tokens: usize, id: u32) -> Item {
        Item {
            key,
            tokens,
            id,
            gone: false,
        }
    }

    fn ids(batch: &[Item]) -> Vec<u32> {
        batch.iter().map(|i| i.id).collect()
    }

    #[test]
    fn one_key_is_first_come_first_served_up_to_the_budget() {
        let mut queue = FairQueue::default();
        for id in 0..5 {
            queue.push(item("", 30, id));
        }
        assert_eq!(ids(&queue.take_batch(100)), [0, 1, 2]);
        assert_eq!(ids(&queue.take_batch(100)), [3, 4]);
        assert!(queue.is_empty());
        // A part above the budget goes alone.
        queue.push(item("", 500, 9));
        assert_eq!(ids(&queue.take_batch(100)), [9]);
    }

    #[test]
    fn a_small_request_of_another_key_goes_before_a_backlog() {
        let mut queue = FairQueue::default();
        for id in 0..8 {
            queue.push(item("hostile", 100, id)); // one huge request, cut into 8 parts
        }
        assert_eq!(ids(&queue.take_batch(100)), [0]);
        queue.push(item("normal", 5, 100));
        // The newcomer starts level with the backlog's key and is smaller: it goes first,
        // in a call of its own (the backlog's next part would pass the budget).
        assert_eq!(ids(&queue.take_batch(100)), [100]);
        assert_eq!(ids(&queue.take_batch(100)), [1]);
        queue.push(item("normal", 5, 101));
        queue.push(item("normal", 5, 102));
        // Both fit beside each other; the backlog's part waits for the next call, first.
        assert_eq!(ids(&queue.take_batch(100)), [101, 102]);
        assert_eq!(ids(&queue.take_batch(100)), [2]);
    }

    #[test]
    fn small_requests_one_after_another_do_not_starve_a_waiting_key() {
        let mut queue = FairQueue::default();
        for id in 0..4 {
            queue.push(item("heavy", 100, id));
        }
        let mut heavy_taken = Vec::new();
        for round in 0..100 {
            // "light" always has its next request waiting when a call is formed.
            queue.push(item("light", 5, 1000 + round));
            for part in queue.take_batch(100) {
                if part.key == "heavy" {
                    heavy_taken.push(round);
                }
            }
        }
        // Light keeps what it was served while idle for a moment: every ~20 of its requests
        // (5 tokens each) the heavy key's next part (100) gets its turn.
        assert_eq!(heavy_taken.len(), 4, "{heavy_taken:?}");
        assert!(
            heavy_taken.windows(2).all(|w| w[1] - w[0] <= 25),
            "{heavy_taken:?}"
        );
    }

    #[test]
    fn two_busy_keys_share_calls_by_tokens() {
        let mut queue = FairQueue::default();
        for id in 0..100 {
            queue.push(item("a", 40, id));
            queue.push(item("b", 10, 1000 + id));
        }
        let mut served = std::collections::HashMap::new();
        for _ in 0..6 {
            for part in queue.take_batch(100) {
                *served.entry(part.key).or_insert(0) += part.tokens;
            }
        }
        let (a, b) = (served["a"], served["b"]);
        assert!(a.abs_diff(b) <= 40, "a={a} b={b}");
    }

    #[test]
    fn idle_time_is_no_credit_and_settled_parts_are_dropped() {
        let mut queue = FairQueue::default();
        queue.push(item("a", 50, 1));
        queue.push(item("a", 50, 2));
        assert_eq!(ids(&queue.take_batch(50)), [1]);
        queue.push(Item {
            gone: true,
            ..item("b", 1, 3)
        });
        queue.push(item("b", 60, 4));
        // b starts where a's part started (0), below a's 50 served: b's part goes first.
        assert_eq!(ids(&queue.take_batch(50)), [4]);
        assert_eq!(ids(&queue.take_batch(50)), [2]);
        // A blocked front holds its key back, not the others.
        queue.push(item("c", 1, 9001));
        queue.push(item("c", 1, 6));
        queue.push(item("d", 1, 7));
        assert_eq!(ids(&queue.take_batch(50)), [7]);
        assert!(queue.take_batch(50).is_empty());
        queue.extract(|i| i.key == "c");
        queue.push(item("c", 1, 5));
        let picked = queue.extract(|i| i.id == 5);
        assert_eq!(ids(&picked), [5]);
        assert!(queue.is_empty() && queue.tokens() == 0);
        assert_eq!(queue.len(), 0);
    }
}
