//! A request this worker holds, cut into parts that each fit one runtime call, and its answer
//! put back together from theirs.
//!
//! One runtime call runs at most `--max-batch-tokens` tokens, so a request of 2048 long texts
//! (or a rerank request of many documents) cannot occupy the runtime for its whole duration
//! while other callers wait: its inputs, sorted by length, are cut into parts of at most that
//! many tokens; each part joins a batch like any small request, and the reply is sent once
//! every part has answered, each row back at its input's place. A vector does not depend on
//! the texts it shares a call with (the runtime pads each forward pass; replies equal
//! in-process results within 1e-6), so the reply is the one a single call would give.
//!
//! Every part of a request holds the same `Held`; whoever settles the request (answers it,
//! hands it back, expires or fails it) takes its envelope, once, and the parts still waiting
//! or running for it are then dropped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_nats::jetstream::{self, message::AckKind};
use tokio::sync::Notify;

use super::intake::{Envelope, Work};
use crate::error::{Error, Result};
use crate::protocol::{Embeddings, Probabilities, ReplyMessage, Scores};
use serde_bytes::ByteBuf;

/// A request held by this worker, shared by its parts.
pub struct Held {
    /// Taken by whoever settles the request.
    envelope: Mutex<Option<Envelope>>,
    /// The same message, for progress acks while parts wait or run.
    msg: jetstream::Message,
    pub deadline_ms: Option<u64>,
    pub min_epoch: u64,
    /// How many times the server has delivered the message, this time included.
    pub delivered: i64,
    /// The caller's API key (`Tf-Key`; "" without one): the queue it waits in.
    pub key: String,
    /// Object-store key of the inputs, deleted once the request is answered.
    pub payload_ref: Option<String>,
    inputs: usize,
    /// How many parts it was cut into, and how many of them are in a runtime call now.
    parts: usize,
    running: AtomicUsize,
    assembly: Mutex<Assembly>,
}

struct Assembly {
    parts_left: usize,
    /// The model its first part ran on: every part must run on it.
    model_key: Option<String>,
    answers: Vec<(Vec<usize>, Answer)>,
}

/// Some of a request's inputs, ready to join a batch.
pub struct Part {
    pub held: Arc<Held>,
    pub work: Work,
    /// Where its inputs sit in the request, ascending.
    pub indices: Vec<usize>,
    pub tokens: usize,
}

impl Held {
    pub fn is_settled(&self) -> bool {
        self.envelope.lock().expect("envelope lock").is_none()
    }

    /// The envelope, to settle the request with; `None` when it is settled already.
    pub fn take(&self) -> Option<Envelope> {
        self.envelope.lock().expect("envelope lock").take()
    }

    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.deadline_ms.is_some_and(|deadline| now_ms > deadline)
    }

    /// Whether it was cut into several parts (it is larger than one call).
    pub fn is_split(&self) -> bool {
        self.parts > 1
    }

    /// A request cut into parts runs one part at a time: the runtime's other slot stays free
    /// for the next caller's request instead of queueing the next part (a part is a full
    /// call, so nothing is gained by queueing it early).
    pub fn has_part_running(&self) -> bool {
        self.parts > 1 && self.running.load(Ordering::Relaxed) > 0
    }

    /// Keeps the message ours (a progress ack) while it is not settled.
    pub async fn keep_alive(&self) {
        if !self.is_settled() {
            let _ = self.msg.ack_with(AckKind::Progress).await;
        }
    }

    /// Binds the request to the model its parts run on; false when an earlier part ran on
    /// another (the placement changed meanwhile): its vectors must not be mixed.
    pub fn pin(&self, model_key: &str) -> bool {
        let mut assembly = self.assembly.lock().expect("assembly lock");
        match &assembly.model_key {
            Some(key) => key == model_key,
            None => {
                assembly.model_key = Some(model_key.to_string());
                true
            }
        }
    }

    /// Files one part's answer; once every part has answered, the request's whole answer.
    pub fn complete(&self, indices: Vec<usize>, answer: Answer) -> Result<Option<Answer>> {
        let mut assembly = self.assembly.lock().expect("assembly lock");
        assembly.answers.push((indices, answer));
        assembly.parts_left = assembly.parts_left.saturating_sub(1);
        if assembly.parts_left > 0 {
            return Ok(None);
        }
        let answers = std::mem::take(&mut assembly.answers);
        Answer::assemble(self.inputs, answers).map(Some)
    }
}

/// Cuts a request into parts of at most `budget` tokens (`counts`: one per input; see
/// `group_inputs`), all sharing one `Held`.
pub fn split(
    envelope: Envelope,
    payload_ref: Option<String>,
    work: Work,
    counts: &[usize],
    budget: usize,
) -> Vec<Part> {
    let inputs = work.inputs();
    let fallback;
    let counts = if counts.len() == inputs {
        counts
    } else {
        fallback = vec![1; inputs];
        &fallback
    };
    let groups = group_inputs(counts, budget);
    let held = Arc::new(Held {
        msg: envelope.msg.clone(),
        deadline_ms: envelope.deadline_ms,
        min_epoch: envelope.min_epoch,
        delivered: envelope.delivered,
        key: envelope.key.clone(),
        envelope: Mutex::new(Some(envelope)),
        payload_ref,
        inputs,
        parts: groups.len(),
        running: AtomicUsize::new(0),
        assembly: Mutex::new(Assembly {
            parts_left: groups.len(),
            model_key: None,
            answers: Vec::with_capacity(groups.len()),
        }),
    });
    let works = work.split(&groups);
    groups
        .into_iter()
        .zip(works)
        .map(|(indices, work)| Part {
            held: held.clone(),
            tokens: indices.iter().map(|&i| counts[i]).sum(),
            indices,
            work,
        })
        .collect()
}

/// Marks parts as in a runtime call until dropped, then wakes the task's loop (`finished`):
/// the next part of their requests may go.
pub struct Running {
    held: Vec<Arc<Held>>,
    finished: Arc<Notify>,
}

impl Running {
    pub fn new(parts: &[Part], finished: Arc<Notify>) -> Self {
        let held: Vec<Arc<Held>> = parts.iter().map(|p| p.held.clone()).collect();
        for request in &held {
            request.running.fetch_add(1, Ordering::Relaxed);
        }
        Self { held, finished }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for request in &self.held {
            request.running.fetch_sub(1, Ordering::Relaxed);
        }
        self.finished.notify_one();
    }
}

/// The inputs of each part (`counts`: tokens per input). A request that fits `budget` is one
/// part in input order; a larger one is sorted by length, longest first, and cut where the
/// next input would not fit, so that each part pads little in the runtime. An input larger
/// than the budget by itself is a part alone.
pub fn group_inputs(counts: &[usize], budget: usize) -> Vec<Vec<usize>> {
    let total: usize = counts.iter().sum();
    if total <= budget || counts.len() <= 1 {
        return vec![(0..counts.len()).collect()];
    }
    let mut order: Vec<usize> = (0..counts.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(counts[i]));
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut tokens = 0;
    for i in order {
        match groups.last_mut() {
            Some(group) if tokens + counts[i] <= budget => group.push(i),
            _ => {
                groups.push(vec![i]);
                tokens = 0;
            }
        }
        tokens += counts[i];
    }
    for group in &mut groups {
        group.sort_unstable();
    }
    groups
}

/// What the runtime answered for one item of a call (a part).
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Embeddings(Embeddings),
    Scores(Scores),
    Probabilities(Probabilities),
}

impl Answer {
    pub fn into_reply(self, request_id: &str, model_key: &str, epoch: u64) -> ReplyMessage {
        match self {
            Answer::Embeddings(r) => ReplyMessage::ok(request_id, model_key, epoch, r),
            Answer::Scores(r) => ReplyMessage::scores(request_id, model_key, epoch, r),
            Answer::Probabilities(r) => {
                ReplyMessage::probabilities(request_id, model_key, epoch, r)
            }
        }
    }

    /// Rows (one per input) and their bytes.
    fn rows(&self) -> (usize, &[u8]) {
        match self {
            Answer::Embeddings(e) => (e.count as usize, &e.embeddings),
            Answer::Scores(s) => (s.count as usize, &s.scores),
            Answer::Probabilities(p) => (p.count as usize, &p.probabilities),
        }
    }

    /// The same kind of answer with other rows.
    fn with_rows(&self, count: usize, bytes: Vec<u8>) -> Answer {
        let count = count as u32;
        let data = ByteBuf::from(bytes);
        match self {
            Answer::Embeddings(e) => Answer::Embeddings(Embeddings {
                dims: e.dims,
                count,
                embeddings: data,
            }),
            Answer::Scores(_) => Answer::Scores(Scores {
                count,
                scores: data,
            }),
            Answer::Probabilities(p) => Answer::Probabilities(Probabilities {
                count,
                labels: p.labels.clone(),
                probabilities: data,
            }),
        }
    }

    /// Whether two parts' answers can be one reply: the same op, width and labels.
    fn fits(&self, other: &Answer) -> bool {
        match (self, other) {
            (Answer::Embeddings(a), Answer::Embeddings(b)) => a.dims == b.dims,
            (Answer::Scores(_), Answer::Scores(_)) => true,
            (Answer::Probabilities(a), Answer::Probabilities(b)) => a.labels == b.labels,
            _ => false,
        }
    }

    /// The answer of a request of `inputs` inputs from its parts' answers, each row put at its
    /// input's place. A part that answered another number of rows than it held inputs, or
    /// parts that disagree (width, labels), are a protocol violation, never a wrong reply.
    pub fn assemble(inputs: usize, mut answers: Vec<(Vec<usize>, Answer)>) -> Result<Answer> {
        let Some((_, first)) = answers.first() else {
            return Err(Error::Protocol("a request with no answered part".into()));
        };
        let (first_rows, first_bytes) = first.rows();
        let width = first_bytes.len().checked_div(first_rows).unwrap_or(0);
        for (indices, answer) in &answers {
            let (rows, bytes) = answer.rows();
            if rows != indices.len() || bytes.len() != rows * width || !first.fits(answer) {
                return Err(Error::Protocol(format!(
                    "a part of {} inputs was answered with {rows} rows of {} bytes",
                    indices.len(),
                    bytes.len()
                )));
            }
        }
        let in_order = |indices: &[usize]| indices.iter().copied().eq(0..inputs);
        if answers.len() == 1 && in_order(&answers[0].0) {
            return Ok(answers.remove(0).1);
        }
        let mut bytes = vec![0u8; inputs * width];
        let mut filled = vec![false; inputs];
        for (indices, answer) in &answers {
            let (_, data) = answer.rows();
            for (row, &at) in indices.iter().enumerate() {
                let slot = filled.get_mut(at).filter(|f| !**f).ok_or_else(|| {
                    Error::Protocol(format!("input {at} answered twice or out of range"))
                })?;
                *slot = true;
                bytes[at * width..(at + 1) * width]
                    .copy_from_slice(&data[row * width..(row + 1) * width]);
            }
        }
        if filled.iter().any(|f| !f) {
            return Err(Error::Protocol(
                "an input of the request went unanswered".into(),
            ));
        }
        Ok(answers[0].1.with_rows(inputs, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_that_fits_is_one_part_and_a_larger_one_parts_sorted_by_length() {
        assert_eq!(group_inputs(&[5, 1, 3], 100), vec![vec![0, 1, 2]]);
        assert_eq!(group_inputs(&[], 100), vec![Vec::<usize>::new()]);
        // 10 + 8 > 12: longest first, each part within the budget, inputs in order inside.
        let groups = group_inputs(&[2, 10, 3, 8, 1, 4], 12);
        assert_eq!(groups, vec![vec![1], vec![3, 5], vec![0, 2, 4]]);
        // An input above the budget alone is its own part.
        assert_eq!(group_inputs(&[50, 1], 10), vec![vec![0], vec![1]]);
        let many = vec![64; 2048];
        let groups = group_inputs(&many, 32768);
        assert_eq!(groups.len(), 4);
        assert!(groups.iter().all(|g| g.len() == 512));
        let mut all: Vec<usize> = groups.concat();
        all.sort_unstable();
        assert_eq!(all, (0..2048).collect::<Vec<_>>());
    }

    fn embeddings(rows: &[[f32; 2]]) -> Answer {
        let bytes: Vec<u8> = rows
            .iter()
            .flatten()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        Answer::Embeddings(Embeddings {
            dims: 2,
            count: rows.len() as u32,
            embeddings: ByteBuf::from(bytes),
        })
    }

    #[test]
    fn parts_answers_go_back_to_their_inputs_places() {
        let parts = vec![
            (vec![1, 3], embeddings(&[[1.0, 1.5], [3.0, 3.5]])),
            (vec![0, 2], embeddings(&[[0.0, 0.5], [2.0, 2.5]])),
        ];
        let whole = Answer::assemble(4, parts).unwrap();
        let expected = embeddings(&[[0.0, 0.5], [1.0, 1.5], [2.0, 2.5], [3.0, 3.5]]);
        assert_eq!(whole, expected);
        // One part in input order is the answer itself.
        let one = Answer::assemble(2, vec![(vec![0, 1], embeddings(&[[1.0, 2.0], [3.0, 4.0]]))]);
        assert_eq!(one.unwrap(), embeddings(&[[1.0, 2.0], [3.0, 4.0]]));
    }

    #[test]
    fn short_or_mismatched_parts_are_refused() {
        let short = vec![(vec![0, 1], embeddings(&[[1.0, 2.0]]))];
        assert!(Answer::assemble(2, short).is_err());
        let twice = vec![
            (vec![0], embeddings(&[[1.0, 2.0]])),
            (vec![0], embeddings(&[[1.0, 2.0]])),
        ];
        assert!(Answer::assemble(2, twice).is_err());
        let scores = Answer::Scores(Scores {
            count: 1,
            scores: ByteBuf::from(vec![0u8; 4]),
        });
        let mixed = vec![(vec![0], embeddings(&[[1.0, 2.0]])), (vec![1], scores)];
        assert!(Answer::assemble(2, mixed).is_err());
        let labels = |l: &[&str]| {
            Answer::Probabilities(Probabilities {
                count: 1,
                labels: l.iter().map(|s| s.to_string()).collect(),
                probabilities: ByteBuf::from(vec![0u8; 4 * l.len()]),
            })
        };
        let other_labels = vec![
            (vec![0], labels(&["a", "b"])),
            (vec![1], labels(&["a", "c"])),
        ];
        assert!(Answer::assemble(2, other_labels).is_err());
    }
}
