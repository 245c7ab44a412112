//! Counts a request's tokens with the served model's own tokenizer (`tokenizer.json` of its
//! base folder, through the `tokenizers` crate), so that batches are formed by the tokens the
//! runtime will compute, not by a guess from the characters. Prefixes and truncation are
//! applied as the runtime applies them: the count is what one forward pass costs.
//!
//! A folder without `tokenizer.json` (or one the crate cannot read) falls back to the old
//! estimate, a quarter of the characters, with a warning: batching still works, only less
//! evenly.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use super::intake::Work;
use crate::protocol::{Placement, TextKind};

/// Above this many texts a request is counted on tokio's blocking pool, not on the loop.
pub const COUNT_INLINE_MAX_TEXTS: usize = 64;

/// The counter of one placement's model.
pub struct TokenCounter {
    /// The model key it was built for.
    pub model_key: String,
    tokenizer: Option<Tokenizer>,
    query_prefix: String,
    passage_prefix: String,
}

impl TokenCounter {
    /// Reads the placement's tokenizer from its base model's folder in the artifact cache at
    /// `cache` (blocking file I/O: call it off the async loop).
    pub fn for_placement(placement: &Placement, cache: &Path) -> Self {
        Self::load(
            &placement.model_key,
            Path::new(&placement.load_request(cache).base_path),
            placement.max_seq_length,
            [&placement.query_prefix, &placement.passage_prefix],
        )
    }

    /// The counter of the model in folder `base`; `max_seq_length` `None` reads the folder's.
    /// `prefixes`: [query, passage].
    pub fn load(
        model_key: &str,
        base: &Path,
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
        let [query_prefix, passage_prefix] = prefixes;
        Self {
            model_key: model_key.to_string(),
            tokenizer,
            query_prefix: query_prefix.to_string(),
            passage_prefix: passage_prefix.to_string(),
        }
    }

    /// A counter that only estimates (used when loading the tokenizer failed outright).
    pub fn estimating(model_key: &str) -> Self {
        Self {
            model_key: model_key.to_string(),
            tokenizer: None,
            query_prefix: String::new(),
            passage_prefix: String::new(),
        }
    }

    /// Whether counts come from the model's tokenizer (else from the estimate).
    pub fn is_exact(&self) -> bool {
        self.tokenizer.is_some()
    }

    /// Tokens of the texts as the runtime will see them: prefix, special tokens, truncation.
    /// At least one per text.
    pub fn count(&self, kind: TextKind, texts: &[String]) -> usize {
        let Some(tokenizer) = &self.tokenizer else {
            return estimate_tokens(texts);
        };
        let prefix = match kind {
            TextKind::Query => &self.query_prefix,
            TextKind::Passage => &self.passage_prefix,
        };
        texts
            .iter()
            .map(|text| {
                let input = if prefix.is_empty() {
                    text.clone()
                } else {
                    format!("{prefix}{text}")
                };
                match tokenizer.encode(input, true) {
                    Ok(encoding) => encoding.len().max(1),
                    Err(_) => estimate_tokens(std::slice::from_ref(text)),
                }
            })
            .sum()
    }

    /// Tokens of (query, document) pairs, each encoded as one sequence the way a cross-encoder
    /// reads it (`[CLS] query [SEP] document [SEP]`, cut longest-first to the limit).
    pub fn count_pairs(&self, query: &str, documents: &[String]) -> usize {
        let estimate = || {
            let query_tokens = estimate_tokens(&[query.to_string()]);
            query_tokens * documents.len() + estimate_tokens(documents)
        };
        let Some(tokenizer) = &self.tokenizer else {
            return estimate();
        };
        let mut total = 0;
        for document in documents {
            match tokenizer.encode((query, document.as_str()), true) {
                Ok(encoding) => total += encoding.len().max(1),
                Err(_) => return estimate(),
            }
        }
        total
    }
}

/// Counts on the blocking pool when the request is large; the texts come back with the count.
pub async fn count_tokens(
    counter: &Arc<TokenCounter>,
    kind: TextKind,
    texts: Vec<String>,
) -> (Vec<String>, usize) {
    if texts.len() <= COUNT_INLINE_MAX_TEXTS || !counter.is_exact() {
        let tokens = counter.count(kind, &texts);
        return (texts, tokens);
    }
    let counter = counter.clone();
    let fallback = estimate_tokens(&texts);
    let shared = Arc::new(texts);
    let inner = shared.clone();
    let counted = tokio::task::spawn_blocking(move || counter.count(kind, &inner)).await;
    let texts = Arc::try_unwrap(shared).unwrap_or_else(|arc| (*arc).clone());
    (texts, counted.unwrap_or(fallback))
}

/// Tokens of one request as the runtime will batch it: embed texts with their kind's prefix,
/// classify texts as queries (the runtime encodes them so), a score request's (query,
/// document) pairs as one sequence each, so the query counts once per document. Large requests
/// are counted on the blocking pool; the work comes back with the count.
pub async fn count_work(counter: &Arc<TokenCounter>, work: Work) -> (Work, usize) {
    match work {
        Work::Embed { kind, texts } => {
            let (texts, tokens) = count_tokens(counter, kind, texts).await;
            (Work::Embed { kind, texts }, tokens)
        }
        Work::Classify { texts } => {
            let (texts, tokens) = count_tokens(counter, TextKind::Query, texts).await;
            (Work::Classify { texts }, tokens)
        }
        Work::Score { query, documents } => {
            if documents.len() <= COUNT_INLINE_MAX_TEXTS || !counter.is_exact() {
                let tokens = counter.count_pairs(&query, &documents);
                return (Work::Score { query, documents }, tokens);
            }
            let shared = Arc::new(Work::Score { query, documents });
            let fallback = shared.tokens();
            let (counter, inner) = (counter.clone(), shared.clone());
            let counted = tokio::task::spawn_blocking(move || match &*inner {
                Work::Score { query, documents } => counter.count_pairs(query, documents),
                other => other.tokens(),
            })
            .await;
            let work = Arc::try_unwrap(shared).unwrap_or_else(|arc| (*arc).clone());
            (work, counted.unwrap_or(fallback))
        }
    }
}

/// The batching estimate without a tokenizer: a quarter of the characters (at least one per
/// text).
pub fn estimate_tokens(texts: &[String]) -> usize {
    texts.iter().map(|t| (t.chars().count() / 4).max(1)).sum()
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
        TokenCounter::load("m", dir, max_seq_length, ["query: ", ""])
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
        // Pairs as one sequence each, small or large (counted on the blocking pool).
        assert_eq!(count_work(&counter, score.clone()).await, (score, 5 + 7));
        let many = Work::Score {
            query: "der".into(),
            documents: vec!["Haus".to_string(); COUNT_INLINE_MAX_TEXTS + 1],
        };
        let (back, tokens) = count_work(&counter, many.clone()).await;
        assert_eq!((back, tokens), (many, 5 * (COUNT_INLINE_MAX_TEXTS + 1)));
        let classify = Work::Classify { texts: documents };
        let expected = counter.count(TextKind::Query, &texts(&["Haus", "Mieter Haus"]));
        assert_eq!(count_work(&counter, classify).await.1, expected);
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

    #[tokio::test]
    async fn large_requests_are_counted_off_the_loop_and_keep_their_texts() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), WORDPIECE).unwrap();
        let counter = Arc::new(counter_in(dir.path(), None));
        let many: Vec<String> = (0..2048).map(|i| format!("haus {i}")).collect();
        let (back, tokens) = count_tokens(&counter, TextKind::Passage, many.clone()).await;
        assert_eq!(back, many);
        // [CLS] haus <digits as [UNK]> [SEP]: 4 per text (the digits are one unknown word).
        assert_eq!(tokens, 4 * 2048);
    }
}
