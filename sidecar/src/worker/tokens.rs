//! Counts a request's tokens with the served model's own tokenizer (`tokenizer.json` of its
//! base folder, through the `tokenizers` crate), so that batches are formed by the tokens the
//! runtime will compute, not by a guess from the characters. Prefixes and truncation are
//! applied as the runtime applies them: the count is what one forward pass costs.
//!
//! Before it is counted, every text is cut to what the model can read: `CHARS_PER_TOKEN`
//! characters per token (`cut_text`), the rule of the runtime's encoder
//! (`serving/runtime/tokenising.py`), so a 30 MB text costs the tokeniser a few thousand
//! characters and reaches the runtime cut. Counting runs on tokio's blocking pool, at most
//! `tokenising_slots()` at once, never on the async loop that sends heartbeats and replies.
//!
//! A folder without `tokenizer.json` (or one the crate cannot read) falls back to the old
//! estimate, a quarter of the characters, with a warning: batching still works, only less
//! evenly.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use tokenizers::{
    PostProcessor, Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy,
};
use tokio::sync::Semaphore;

use super::intake::Work;
use crate::protocol::{Placement, TextKind};

/// Characters of a text kept per token the model reads (`serving/runtime/tokenising.py` has the
/// same number and says why it is generous; a test keeps the two equal).
pub const CHARS_PER_TOKEN: usize = 16;
/// The tokens a model is taken to read when neither its placement nor its folder names a
/// limit: only the cut uses it (no truncation is made up).
pub const UNKNOWN_LIMIT_TOKENS: usize = 8192;

/// Cuts `text` to what a model reading `tokens` tokens can see: `tokens x CHARS_PER_TOKEN`
/// characters (Unicode scalar values, as Python counts them). Cutting twice is cutting once.
pub fn cut_text(text: &mut String, tokens: usize) {
    let limit = tokens.saturating_mul(CHARS_PER_TOKEN);
    if text.len() <= limit {
        return; // fewer bytes than the limit: fewer characters too
    }
    if let Some((at, _)) = text.char_indices().nth(limit) {
        text.truncate(at);
    }
}

/// The counter of one placement's model.
pub struct TokenCounter {
    /// The model key it was built for.
    pub model_key: String,
    tokenizer: Option<Tokenizer>,
    query_prefix: String,
    passage_prefix: String,
    /// The model's `max_seq_length` (None: no limit known).
    max_len: Option<usize>,
    /// Tokens the model reads of one text: `max_len`, more for a head that reads windows.
    read_tokens: usize,
    /// Special tokens a (query, document) pair gets (`[CLS] q [SEP] d [SEP]`: 3).
    pair_specials: usize,
}

impl TokenCounter {
    /// Reads the placement's tokenizer from its base model's folder in the artifact cache at
    /// `cache`, and its adapter's head (a head that reads windows) (blocking file I/O: call it
    /// off the async loop).
    pub fn for_placement(placement: &Placement, cache: &Path) -> Self {
        let request = placement.load_request(cache);
        Self::load(
            &placement.model_key,
            Path::new(&request.base_path),
            request.adapter_path.as_deref().map(Path::new),
            placement.max_seq_length,
            [&placement.query_prefix, &placement.passage_prefix],
        )
    }

    /// The counter of the model in folder `base` (with the adapter folder `adapter`, if any);
    /// `max_seq_length` `None` reads the folder's. `prefixes`: [query, passage].
    pub fn load(
        model_key: &str,
        base: &Path,
        adapter: Option<&Path>,
        max_seq_length: Option<u32>,
        prefixes: [&str; 2],
    ) -> Self {
        let max_len = max_seq_length
            .map(|n| n as usize)
            .or_else(|| folder_max_seq_length(base));
        let tokenizer = match load_tokenizer(base, max_len) {
            Ok(tokenizer) => Some(tokenizer),
            Err(reason) => {
                tracing::warn!(%model_key, %reason, "batching by estimated tokens (characters / 4)");
                None
            }
        };
        let pair_specials = tokenizer
            .as_ref()
            .and_then(|t| t.get_post_processor())
            .map_or(0, |p| p.added_tokens(true));
        let limit = max_len.unwrap_or(UNKNOWN_LIMIT_TOKENS);
        let read_tokens = match adapter.and_then(head_windows) {
            Some((stride, max_windows)) => limit + stride * (max_windows.max(1) - 1),
            None => limit,
        };
        let [query_prefix, passage_prefix] = prefixes;
        Self {
            model_key: model_key.to_string(),
            tokenizer,
            query_prefix: query_prefix.to_string(),
            passage_prefix: passage_prefix.to_string(),
            max_len,
            read_tokens,
            pair_specials,
        }
    }

    /// A counter that only estimates (used when loading the tokenizer failed outright).
    pub fn estimating(model_key: &str) -> Self {
        Self {
            model_key: model_key.to_string(),
            tokenizer: None,
            query_prefix: String::new(),
            passage_prefix: String::new(),
            max_len: None,
            read_tokens: UNKNOWN_LIMIT_TOKENS,
            pair_specials: 0,
        }
    }

    /// Whether counts come from the model's tokenizer (else from the estimate).
    pub fn is_exact(&self) -> bool {
        self.tokenizer.is_some()
    }

    /// The tokens of one text the model reads: what `cut` cuts texts to (in characters).
    pub fn read_tokens(&self) -> usize {
        self.read_tokens
    }

    /// Cuts every text of the work (a score request's query too) to what the model reads.
    pub fn cut(&self, work: &mut Work) {
        for text in work.texts_mut() {
            cut_text(text, self.read_tokens);
        }
    }

    /// Tokens of each text as the runtime will see it: prefix, special tokens, truncation.
    /// At least one per text.
    pub fn counts(&self, kind: TextKind, texts: &[String]) -> Vec<usize> {
        let Some(tokenizer) = &self.tokenizer else {
            return texts.iter().map(|t| self.estimate(t)).collect();
        };
        let prefix = match kind {
            TextKind::Query => &self.query_prefix,
            TextKind::Passage => &self.passage_prefix,
        };
        texts
            .iter()
            .map(|text| {
                let input = format!("{prefix}{text}");
                match tokenizer.encode_fast(input, true) {
                    Ok(encoding) => encoding.len().max(1),
                    Err(_) => self.estimate(text),
                }
            })
            .collect()
    }

    /// Tokens of the texts together (see `counts`).
    pub fn count(&self, kind: TextKind, texts: &[String]) -> usize {
        self.counts(kind, texts).iter().sum()
    }

    /// Tokens of each (query, document) pair, encoded as one sequence the way a cross-encoder
    /// reads it (`[CLS] query [SEP] document [SEP]`, cut longest-first to the limit). The
    /// query is tokenised once: a pair holds `specials + min(query + document, limit -
    /// specials)` tokens, whichever text the longest-first rule cuts.
    pub fn pair_counts(&self, query: &str, documents: &[String]) -> Vec<usize> {
        let estimate = || {
            let query_tokens = self.estimate(query);
            documents
                .iter()
                .map(|d| query_tokens + self.estimate(d))
                .collect()
        };
        let Some(tokenizer) = &self.tokenizer else {
            return estimate();
        };
        // Without special tokens, cut at the limit: a pair never keeps more of either text.
        let pieces = |text: &str| tokenizer.encode_fast(text, false).map(|e| e.len());
        let Ok(query_pieces) = pieces(query) else {
            return estimate();
        };
        let specials = self.pair_specials;
        let budget = self.max_len.map(|n| n.saturating_sub(specials));
        let mut counts = Vec::with_capacity(documents.len());
        for document in documents {
            let Ok(document_pieces) = pieces(document) else {
                return estimate();
            };
            let both = query_pieces + document_pieces;
            let kept = budget.map_or(both, |budget| both.min(budget));
            counts.push((specials + kept).max(1));
        }
        counts
    }

    /// Tokens of the pairs together (see `pair_counts`).
    pub fn count_pairs(&self, query: &str, documents: &[String]) -> usize {
        self.pair_counts(query, documents).iter().sum()
    }

    /// Tokens of each input of a request as the runtime will batch it: embed texts with their
    /// kind's prefix, classify texts as queries (the runtime encodes them so), a score
    /// request's (query, document) pairs as one sequence each.
    pub fn work_counts(&self, work: &Work) -> Vec<usize> {
        match work {
            Work::Embed { kind, texts } => self.counts(*kind, texts),
            Work::Classify { texts } => self.counts(TextKind::Query, texts),
            Work::Score { query, documents } => self.pair_counts(query, documents),
        }
    }

    /// The estimate without a tokenizer: a quarter of the characters, at least one, at most
    /// what the model reads.
    fn estimate(&self, text: &str) -> usize {
        (text.chars().count() / 4).clamp(1, self.read_tokens.max(1))
    }
}

/// How many requests are cut and counted at once (tokio's blocking pool itself allows
/// hundreds of threads; counting must leave the cores to the runtime).
pub fn tokenising_slots() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get().div_ceil(2))
        .unwrap_or(1)
        .clamp(1, 4)
}

fn tokenising() -> &'static Semaphore {
    static SLOTS: OnceLock<Semaphore> = OnceLock::new();
    SLOTS.get_or_init(|| Semaphore::new(tokenising_slots()))
}

/// Cuts the request's texts to what the model reads and counts each input's tokens (see
/// `TokenCounter::work_counts`), on the blocking pool: however large the request, the async
/// loop goes on sending heartbeats, pulling and replying meanwhile. The work comes back cut,
/// with one count per input.
pub async fn prepare(counter: &Arc<TokenCounter>, work: Work) -> (Work, Vec<usize>) {
    let _slot = tokenising().acquire().await.expect("never closed");
    let counter = counter.clone();
    let blocking = tokio::task::spawn_blocking(move || {
        let mut work = work;
        counter.cut(&mut work);
        let counts = counter.work_counts(&work);
        (work, counts)
    });
    match blocking.await {
        Ok(prepared) => prepared,
        // Only a panic inside the tokenizer gets here; the work went down with it.
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

// Here, not in intake.rs, where `Work` is: counting is this module's concern, and intake
// needs nothing of it.
impl Work {
    /// The batching estimate of tokens. A (query, document) pair is one sequence holding both
    /// texts, so a score request counts the query once per document.
    pub fn tokens(&self) -> usize {
        match self {
            Work::Embed { texts, .. } | Work::Classify { texts } => estimate_tokens(texts),
            Work::Score { query, documents } => {
                let query_tokens = estimate_tokens(std::slice::from_ref(query));
                query_tokens * documents.len() + estimate_tokens(documents)
            }
        }
    }
}

/// The batching estimate without a tokenizer: a quarter of the characters (at least one per
/// text).
pub fn estimate_tokens(texts: &[String]) -> usize {
    texts.iter().map(|t| (t.chars().count() / 4).max(1)).sum()
}

/// A head that reads a long text as windows (`head.json` of the adapter folder, see
/// `serving/runtime/heads.py`): (window_stride, max_windows).
fn head_windows(adapter: &Path) -> Option<(usize, usize)> {
    let head = read_json(&adapter.join("head.json"))?;
    let stride = head.get("window_stride")?.as_u64()?;
    let max_windows = head
        .get("max_windows")
        .and_then(|v| v.as_u64())
        .unwrap_or(1);
    Some((stride as usize, max_windows.min(1 << 16) as usize))
}

/// `tokenizer.json` of a sentence-transformers folder: at its root, else in the folder of its
/// first module (modules.json), where older exports keep the transformer.
fn tokenizer_file(base: &Path) -> Option<PathBuf> {
    let root = base.join("tokenizer.json");
    if root.is_file() {
        return Some(root);
    }
    let modules: serde_json::Value = read_json(&base.join("modules.json"))?;
    let first = modules.as_array()?.first()?.get("path")?.as_str()?;
    let nested = base.join(first).join("tokenizer.json");
    nested.is_file().then_some(nested)
}

fn load_tokenizer(base: &Path, max_len: Option<usize>) -> Result<Tokenizer, String> {
    let file = tokenizer_file(base).ok_or_else(|| format!("no tokenizer.json in {base:?}"))?;
    let mut tokenizer =
        Tokenizer::from_file(&file).map_err(|e| format!("cannot read {file:?}: {e}"))?;
    // tokenizer.json may carry its own truncation and fixed padding; the runtime truncates at
    // the model's max_seq_length and pads each pass to its own longest text.
    tokenizer.with_padding(None);
    let truncation = max_len.map(|max_length| TruncationParams {
        max_length,
        strategy: TruncationStrategy::LongestFirst,
        direction: TruncationDirection::Right,
        stride: 0,
    });
    tokenizer
        .with_truncation(truncation)
        .map_err(|e| format!("truncation of {file:?}: {e}"))?;
    Ok(tokenizer)
}

/// sentence-transformers' `max_seq_length` of the folder: `sentence_bert_config.json`, else
/// (sentence-transformers 6 keeps it on the tokenizer) `tokenizer_config.json`'s
/// `model_max_length` unless that is transformers' "no limit" sentinel.
fn folder_max_seq_length(base: &Path) -> Option<usize> {
    let from = |file: &str, key: &str| {
        read_json(&base.join(file))?
            .get(key)?
            .as_u64()
            .filter(|&n| n > 0 && n < 1_000_000)
            .map(|n| n as usize)
    };
    from("sentence_bert_config.json", "max_seq_length")
        .or_else(|| from("tokenizer_config.json", "model_max_length"))
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A complete WordPiece `tokenizer.json` as transformers writes it for BERT.
    const WORDPIECE: &str = r###"{
      "version": "1.0", "truncation": {"direction": "Right", "max_length": 3,
        "strategy": "LongestFirst", "stride": 0},
      "padding": {"strategy": {"Fixed": 16}, "direction": "Right", "pad_to_multiple_of": null,
        "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"},
      "added_tokens": [],
      "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
        "strip_accents": false, "lowercase": true},
      "pre_tokenizer": {"type": "BertPreTokenizer"},
      "post_processor": {"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}},
                 {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
        "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                           "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
      "decoder": null,
      "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
        "max_input_chars_per_word": 100,
        "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "der": 4, "miet": 5,
                  "##er": 6, "haus": 7, "query": 8, ":": 9}}
    }"###;

    fn counter_in(dir: &Path, max_seq_length: Option<u32>) -> TokenCounter {
        TokenCounter::load("m", dir, None, max_seq_length, ["query: ", ""])
    }

    fn texts(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn counts_the_models_tokens_with_specials_prefix_and_truncation() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), WORDPIECE).unwrap();
        std::fs::write(
            dir.path().join("sentence_bert_config.json"),
            r#"{"max_seq_length": 6}"#,
        )
        .unwrap();
        let counter = counter_in(dir.path(), None);
        assert!(counter.is_exact());
        // [CLS] der miet ##er [SEP]: 5 tokens (the file's own truncation at 3 and fixed
        // padding to 16 are replaced by the model's max_seq_length and no padding).
        assert_eq!(counter.count(TextKind::Passage, &texts(&["Der Mieter"])), 5);
        // The query prefix counts too: [CLS] query : der [SEP].
        assert_eq!(counter.count(TextKind::Query, &texts(&["der"])), 5);
        // Truncated at max_seq_length 6, as the runtime truncates.
        let long = ["der haus"; 20].join(" ");
        assert_eq!(
            counter.count(TextKind::Passage, &texts(&[&long, "haus"])),
            6 + 3
        );
        // The placement's own max_seq_length wins over the folder's.
        let counter = counter_in(dir.path(), Some(4));
        assert_eq!(counter.count(TextKind::Passage, &texts(&[&long])), 4);
    }

    #[test]
    fn counts_pairs_as_one_sequence_each() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), WORDPIECE).unwrap();
        let counter = counter_in(dir.path(), Some(8));
        // [CLS] der [SEP] haus [SEP] + [CLS] der [SEP] miet ##er haus [SEP]
        let documents = texts(&["Haus", "Mieter Haus"]);
        assert_eq!(counter.count_pairs("der", &documents), 5 + 7);
        // Longest first to the limit: 8 tokens, however long the document.
        let long = texts(&[&["haus"; 50].join(" ")]);
        assert_eq!(counter.count_pairs("der", &long), 8);
        // Without a tokenizer: the query counts once per document.
        let estimating = TokenCounter::estimating("m");
        assert_eq!(
            estimating.count_pairs(&"q".repeat(40), &documents),
            10 * 2 + 1 + 2
        );
    }

    #[tokio::test]
    async fn a_request_counts_as_the_runtime_batches_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), WORDPIECE).unwrap();
        let counter = Arc::new(counter_in(dir.path(), Some(8)));
        let documents = texts(&["Haus", "Mieter Haus"]);
        let score = Work::Score {
            query: "der".into(),
            documents: documents.clone(),
        };
        // Pairs as one sequence each, one count per document.
        assert_eq!(prepare(&counter, score.clone()).await, (score, vec![5, 7]));
        let classify = Work::Classify { texts: documents };
        let expected = counter.counts(TextKind::Query, &texts(&["Haus", "Mieter Haus"]));
        assert_eq!(prepare(&counter, classify).await.1, expected);
    }

    #[test]
    fn pair_counts_equal_the_tokenizers_own_pair_encoding() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), WORDPIECE).unwrap();
        let words = ["der", "haus", "mieter", "miet", "der haus"];
        for limit in [None, Some(4), Some(7), Some(8), Some(12)] {
            let counter = counter_in(dir.path(), limit);
            let tokenizer = load_tokenizer(dir.path(), limit.map(|n| n as usize)).unwrap();
            for q in 0..6 {
                let query = words[q % words.len()].repeat(q);
                let documents: Vec<String> = (0..6).map(|d| words[d % 5].repeat(d)).collect();
                let expected: Vec<usize> = documents
                    .iter()
                    .map(|d| {
                        tokenizer
                            .encode((query.as_str(), d.as_str()), true)
                            .unwrap()
                            .len()
                    })
                    .collect();
                assert_eq!(
                    counter.pair_counts(&query, &documents),
                    expected,
                    "{limit:?} {query:?}"
                );
            }
        }
    }

    #[test]
    fn texts_are_cut_to_what_the_model_reads_by_characters() {
        let mut text = "ä".repeat(100);
        cut_text(&mut text, 2);
        assert_eq!(text, "ä".repeat(2 * CHARS_PER_TOKEN)); // characters, not bytes
        cut_text(&mut text, 2);
        assert_eq!(text.chars().count(), 2 * CHARS_PER_TOKEN);
        let mut short = "kurz".to_string();
        cut_text(&mut short, 1);
        assert_eq!(short, "kurz");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), WORDPIECE).unwrap();
        let counter = counter_in(dir.path(), Some(6));
        assert_eq!(counter.read_tokens(), 6);
        let mut work = Work::Score {
            query: "der ".repeat(1000),
            documents: vec!["haus ".repeat(1000), "haus".into()],
        };
        counter.cut(&mut work);
        let Work::Score { query, documents } = &work else {
            unreachable!()
        };
        assert_eq!(query.len(), 6 * CHARS_PER_TOKEN);
        assert_eq!(documents[0].len(), 6 * CHARS_PER_TOKEN);
        assert_eq!(documents[1], "haus");
        // A head that reads windows reads more of each text.
        let adapter = tempfile::tempdir().unwrap();
        std::fs::write(
            adapter.path().join("head.json"),
            r#"{"kind": "classify", "window_stride": 3, "max_windows": 4}"#,
        )
        .unwrap();
        let windows = TokenCounter::load("m", dir.path(), Some(adapter.path()), Some(6), ["", ""]);
        assert_eq!(windows.read_tokens(), 6 + 3 * 3);
        assert_eq!(
            TokenCounter::estimating("m").read_tokens(),
            UNKNOWN_LIMIT_TOKENS
        );
    }

    #[test]
    fn finds_the_tokenizer_of_the_first_module_and_the_limit_on_the_tokenizer() {
        let dir = tempfile::tempdir().unwrap();
        let module = dir.path().join("0_Transformer");
        std::fs::create_dir(&module).unwrap();
        std::fs::write(module.join("tokenizer.json"), WORDPIECE).unwrap();
        std::fs::write(
            dir.path().join("modules.json"),
            r#"[{"idx": 0, "name": "0", "path": "0_Transformer"}]"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"model_max_length": 3}"#,
        )
        .unwrap();
        let counter = counter_in(dir.path(), None);
        assert!(counter.is_exact());
        assert_eq!(
            counter.count(TextKind::Passage, &texts(&["der haus haus"])),
            3
        );
        // transformers' "no limit" sentinel is no limit.
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"model_max_length": 1000000000000000019884624838656}"#,
        )
        .unwrap();
        let counter = counter_in(dir.path(), None);
        assert_eq!(
            counter.count(TextKind::Passage, &texts(&["der haus haus"])),
            5
        );
    }

    #[test]
    fn without_a_tokenizer_the_estimate_is_used() {
        let dir = tempfile::tempdir().unwrap();
        let counter = counter_in(dir.path(), None);
        assert!(!counter.is_exact());
        assert_eq!(
            counter.count(TextKind::Passage, &texts(&["abcdefgh", ""])),
            2 + 1
        );
        std::fs::write(dir.path().join("tokenizer.json"), "{not json").unwrap();
        assert!(!counter_in(dir.path(), None).is_exact());
    }

    /// Counting runs on the blocking pool: on a one-thread runtime a ticking task keeps
    /// ticking while a large request is counted (inline, it could not tick at all).
    #[tokio::test]
    async fn requests_are_counted_off_the_loop_and_keep_their_texts() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), WORDPIECE).unwrap();
        let counter = Arc::new(counter_in(dir.path(), None));
        let many: Vec<String> = (0..2048).map(|i| format!("haus {i}")).collect();
        let work = Work::Embed {
            kind: TextKind::Passage,
            texts: many.clone(),
        };
        let (back, counts) = prepare(&counter, work.clone()).await;
        assert_eq!(back, work);
        // [CLS] haus <digits as [UNK]> [SEP]: 4 per text (the digits are one unknown word).
        assert_eq!(counts, vec![4; 2048]);

        let ticks = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let ticker = {
            let ticks = ticks.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        };
        // One text of 20 million characters with no model limit: cut to UNKNOWN_LIMIT_TOKENS
        // x 16 characters, still the longest single count a request can ask for.
        let huge = Work::Embed {
            kind: TextKind::Passage,
            texts: vec!["der haus ".repeat(20_000_000 / 9); 4],
        };
        tokio::task::yield_now().await;
        let before = ticks.load(std::sync::atomic::Ordering::Relaxed);
        let started = std::time::Instant::now();
        let (cut, counts) = prepare(&counter, huge).await;
        let took = started.elapsed();
        let ticked = ticks.load(std::sync::atomic::Ordering::Relaxed) - before;
        ticker.abort();
        // About two word pieces per 9 characters kept, [CLS] and [SEP].
        assert_eq!(counts.len(), 4);
        assert!(counts
            .iter()
            .all(|&c| c == counts[0] && c > 2 * 131_072 / 9));
        let Work::Embed { texts, .. } = cut else {
            unreachable!()
        };
        assert!(texts
            .iter()
            .all(|t| t.len() == UNKNOWN_LIMIT_TOKENS * CHARS_PER_TOKEN));
        // The loop ran while the count did (a tick per millisecond or so; inline, none).
        assert!(
            took > Duration::from_millis(20),
            "counted in {took:?}: too fast to tell"
        );
        assert!(
            ticked >= took.as_millis() as u64 / 20,
            "{ticked} ticks in {took:?}"
        );
    }
}
