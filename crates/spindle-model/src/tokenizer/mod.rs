//! Text to token ids and back.
//!
//! One [`Tokenizer`] type, built either from a GGUF file's metadata
//! ([`Tokenizer::from_gguf`]) or from a Hugging Face model directory
//! ([`Tokenizer::from_hf_dir`]). Both end in the same Hugging Face
//! `tokenizers` pipeline, so a GGUF vocabulary tokenizes exactly as the
//! `tokenizer.json` that transformers' own GGUF converter builds for it:
//!
//! * `tokenizer.ggml.model = "llama"` (SentencePiece vocabulary with scores and
//!   `<0xNN>` byte tokens, Gemma, Llama 2, Mistral): a BPE model whose merges are
//!   derived from the vocabulary ordered by score (for Gemma: by position, as
//!   transformers does), with byte fallback; see `spm.rs`.
//! * `tokenizer.ggml.model = "gpt2"` (byte-level BPE with merges, Llama 3,
//!   Qwen 2): a `Split` pre-tokenizer with the regex `tokenizer.ggml.pre` names,
//!   then `ByteLevel`; see `bpe.rs`.
//!
//! # Special tokens
//!
//! GGUF token types 2 (unknown) and 3 (control) become *special* added tokens:
//! `encode(.., parse_special = true)` matches their text (`<start_of_turn>`,
//! `<|im_end|>`) as the one token, `parse_special = false` tokenizes that text
//! like any other text. Type 4 (user-defined: Gemma's `<table>`, `\n\n`, `\t`)
//! becomes a non-special added token, matched whole in the text either way,
//! as llama.cpp and transformers do. From a `tokenizer.json`, its own
//! `added_tokens` and their `special` flags are used.
//!
//! # Decoding
//!
//! [`Tokenizer::decode`] leaves out special (control) tokens such as `<bos>`,
//! `<eos>`, `<end_of_turn>` and keeps every other token, user-defined ones
//! included. Text is built from the bytes of each token and turned into a
//! string once, so byte-fallback tokens that together form one character
//! decode to it; invalid UTF-8 becomes U+FFFD. [`StreamDecoder`] gives the
//! same text piece by piece.
//!
//! Over ~500 lines on purpose: this file is the one `Tokenizer` and its
//! special-token rules (BOS, stop ids, chat prompts, pieces and bytes),
//! which every builder below shares; the builders themselves are in
//! `spm.rs`, `bpe.rs`, `gguf.rs` and `hf.rs`.

mod bpe;
mod bytes;
mod gguf;
mod hf;
mod spm;
mod stream;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokenizers::decoders::DecoderWrapper;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, AddedVocabulary, Model, ModelWrapper, TokenizerImpl};

pub use gguf::{token_type, GgufVocab};
pub use stream::StreamDecoder;

/// Why a tokenizer could not be built, or could not encode or decode.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A metadata key the tokenizer needs is missing or has the wrong type.
    #[error("tokenizer metadata: {0}")]
    Metadata(String),

    /// `tokenizer.ggml.model` names a kind of tokenizer this crate cannot build.
    #[error(
        "unsupported tokenizer model {0:?}: only \"llama\" (SentencePiece) and \"gpt2\" \
         (byte-level BPE) vocabularies are supported"
    )]
    UnsupportedModel(String),

    /// A tokenizer file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A tokenizer file is a FIFO, a device or a symlink loop.
    #[error(transparent)]
    File(#[from] spindle_formats::FormatError),

    /// A tokenizer file could not be parsed.
    #[error("cannot parse {}: {message}", path.display())]
    Parse { path: PathBuf, message: String },

    /// The Hugging Face `tokenizers` pipeline failed.
    #[error("tokenizer: {0}")]
    Backend(String),

    /// Text that is not UTF-8, for a vocabulary that cannot hold its bytes.
    #[error(
        "the text is not valid UTF-8 and this vocabulary has no byte tokens to hold \
         its bytes: convert the text to UTF-8 first"
    )]
    NoByteTokens,

    /// A token id past the end of the vocabulary.
    #[error("token id {id} is out of range: the vocabulary has {vocab_size} tokens")]
    IdOutOfRange { id: u32, vocab_size: usize },
}

pub(crate) fn backend(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Backend(e.to_string())
}

/// The `tokenizers` model shared by the two pipelines of a [`Tokenizer`]
/// (one matching special tokens in the text, one not), so the vocabulary and
/// merges are held once.
#[derive(Clone)]
pub(crate) struct SharedModel(Arc<ModelWrapper>);

impl Model for SharedModel {
    type Trainer = <ModelWrapper as Model>::Trainer;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<tokenizers::Token>> {
        self.0.tokenize(sequence)
    }
    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.0.token_to_id(token)
    }
    fn id_to_token(&self, id: u32) -> Option<String> {
        self.0.id_to_token(id)
    }
    fn get_vocab(&self) -> HashMap<String, u32> {
        self.0.get_vocab()
    }
    fn get_vocab_size(&self) -> usize {
        self.0.get_vocab_size()
    }
    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        self.0.save(folder, prefix)
    }
    fn get_trainer(&self) -> Self::Trainer {
        self.0.get_trainer()
    }
}

pub(crate) type Pipeline = TokenizerImpl<
    SharedModel,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

/// How the text of a token becomes bytes when decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PieceKind {
    /// SentencePiece: `▁` is a space, `<0xNN>` is the byte NN. With
    /// `strip_first_space`, the space the encoder put before the text
    /// (`add_dummy_prefix`) is dropped from the start of the output.
    SentencePiece { strip_first_space: bool },
    /// GPT-2 byte-level: each character of a token stands for one byte.
    ByteLevel,
    /// Anything else: each token goes through the `tokenizer.json` decoder on
    /// its own.
    Other,
}

/// Everything a builder produces; turned into a [`Tokenizer`] by [`Tokenizer::assemble`].
pub(crate) struct Parts {
    pub model: ModelWrapper,
    pub normalizer: Option<NormalizerWrapper>,
    pub pre_tokenizer: Option<PreTokenizerWrapper>,
    pub decoder: Option<DecoderWrapper>,
    pub added: Added,
    pub kind: PieceKind,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// Further end-of-turn ids named by the file (`eot_token_id`, `eom_token_id`).
    pub extra_stops: Vec<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub chat_template: Option<String>,
    pub family: Option<String>,
}

/// The added tokens of a tokenizer.
pub(crate) enum Added {
    /// Tokens to add, all already in the model's vocabulary; `special` ones
    /// are the control tokens.
    Tokens(Vec<AddedToken>),
    /// A `tokenizer.json`'s own, ids and all.
    Vocabulary(Box<AddedVocabulary>),
}

struct Inner {
    /// Matches special-token text as the special token.
    parse: Pipeline,
    /// Tokenizes special-token text as plain text.
    literal: Pipeline,
    kind: PieceKind,
    /// The bytes each id decodes to (empty for unknown ids).
    pieces: Vec<Box<[u8]>>,
    /// Ids left out of decoded text (special added tokens).
    skip: Vec<bool>,
    vocab_size: usize,
    bos: Option<u32>,
    eos: Option<u32>,
    stops: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    chat_template: Option<String>,
    family: Option<String>,
    /// The text of each special token, made when first needed.
    special_texts: std::sync::OnceLock<SpecialTexts>,
}

/// The texts of the special tokens, found in a text in one pass: only at
/// bytes that start one, and only for the lengths they have (a vocabulary
/// can have thousands of them, `<unused0>` and on).
struct SpecialTexts {
    texts: std::collections::HashSet<String>,
    lens: Vec<usize>,
    starts: [bool; 256],
}

impl SpecialTexts {
    fn new(texts: impl Iterator<Item = String>) -> SpecialTexts {
        let texts: std::collections::HashSet<String> = texts.collect();
        let mut lens: Vec<usize> = texts.iter().map(String::len).collect();
        lens.sort_unstable();
        lens.dedup();
        let mut starts = [false; 256];
        for t in &texts {
            starts[t.as_bytes()[0] as usize] = true;
        }
        SpecialTexts {
            texts,
            lens,
            starts,
        }
    }

    /// The first special-token text in `t`.
    fn first_in<'a>(&self, t: &'a str) -> Option<&'a str> {
        t.bytes()
            .enumerate()
            .filter(|&(_, b)| self.starts[b as usize])
            .find_map(|(i, _)| {
                self.lens
                    .iter()
                    .filter_map(|&l| t.get(i..i + l))
                    .find(|s| self.texts.contains(*s))
            })
    }
}

/// A tokenizer: encode text to ids, decode ids to text. Cheap to clone (the
/// vocabulary is shared).
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.inner.vocab_size)
            .field("kind", &self.inner.kind)
            .field("bos", &self.inner.bos)
            .field("eos", &self.inner.eos)
            .field("family", &self.inner.family)
            .finish()
    }
}

/// Texts of end-of-turn tokens that stop generation when the vocabulary has
/// them as special tokens (a GGUF's are made special when it has them, see
/// `GgufVocab::retype_as_llama_cpp_does`).
pub(crate) const END_OF_TURN_TOKENS: &[&str] = &[
    "<end_of_turn>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<|end|>",
    "<|return|>",
    // gpt-oss ends a turn that calls a function with it.
    "<|call|>",
    "</s>",
    "<eos>",
];

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes in its `tokenizer.*` metadata.
    pub fn from_gguf(gguf: &spindle_formats::GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_gguf_vocab(GgufVocab::from_metadata(|key| gguf.get(key))?)
    }

    /// Builds the tokenizer of vocabulary metadata already read from a GGUF file.
    pub fn from_gguf_vocab(vocab: GgufVocab) -> Result<Tokenizer, TokenizerError> {
        let parts = match vocab.model.as_str() {
            "llama" => spm::build(vocab)?,
            "gpt2" => bpe::build(vocab)?,
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        Tokenizer::assemble(parts)
    }

    /// Builds the tokenizer of a Hugging Face model directory: `tokenizer.json`,
    /// with `tokenizer_config.json` (when present) for the BOS/EOS tokens,
    /// `add_bos_token`, `add_eos_token` and `chat_template`.
    pub fn from_hf_dir(dir: &Path) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::assemble(hf::build(dir)?)
    }

    fn assemble(parts: Parts) -> Result<Tokenizer, TokenizerError> {
        let model = SharedModel(Arc::new(parts.model));
        let mut parse = Pipeline::new(model);
        parse
            .with_normalizer(parts.normalizer)
            .with_pre_tokenizer(parts.pre_tokenizer)
            .with_decoder(parts.decoder);
        match parts.added {
            Added::Tokens(tokens) => {
                let (special, plain): (Vec<AddedToken>, Vec<AddedToken>) =
                    tokens.into_iter().partition(|t| t.special);
                parse.add_special_tokens(&special);
                parse.add_tokens(&plain);
            }
            Added::Vocabulary(vocabulary) => {
                parse.with_added_vocabulary(*vocabulary);
            }
        }
        let mut literal = parse.clone();
        literal.set_encode_special_tokens(true);

        let vocab_size = parse.get_vocab_size(true);
        let mut pieces = vec![Box::<[u8]>::default(); vocab_size];
        let mut skip = vec![false; vocab_size];
        let added = parse.get_added_vocabulary();
        for (id, piece) in pieces.iter_mut().enumerate() {
            let id = id as u32;
            let Some(text) = parse.id_to_token(id) else {
                continue;
            };
            if added.is_special_token(&text) {
                skip[id as usize] = true;
            }
            *piece = token_bytes(&parse, parts.kind, &text).into_boxed_slice();
        }

        let mut stops: Vec<u32> = parts.eos.into_iter().chain(parts.extra_stops).collect();
        for text in END_OF_TURN_TOKENS {
            if let Some(id) = parse.token_to_id(text) {
                if skip.get(id as usize).copied().unwrap_or(false) {
                    stops.push(id);
                }
            }
        }
        // gpt-oss (harmony) ends every message with `<|end|>` but a turn
        // only with `<|return|>` or `<|call|>`: a reply that reasons first
        // goes on after its analysis message to the final one. llama.cpp
        // drops `<|end|>` from its end-of-generation set on the same test.
        let id_of = |text: &str| parse.token_to_id(text);
        if let (Some(end), Some(_), Some(_)) =
            (id_of("<|end|>"), id_of("<|return|>"), id_of("<|call|>"))
        {
            stops.retain(|&s| s != end);
        }
        stops.sort_unstable();
        stops.dedup();

        Ok(Tokenizer {
            inner: Arc::new(Inner {
                parse,
                literal,
                kind: parts.kind,
                pieces,
                skip,
                vocab_size,
                bos: parts.bos,
                eos: parts.eos,
                stops,
                add_bos: parts.add_bos,
                add_eos: parts.add_eos,
                chat_template: parts.chat_template,
                family: parts.family,
                special_texts: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Token ids of `text`. `add_bos` puts the BOS token first (when the
    /// vocabulary has one). With `parse_special`, the text of a special token
    /// (`<start_of_turn>`) becomes that token; without it, that text is
    /// tokenized as ordinary text, which is what untrusted user input wants.
    pub fn encode(
        &self,
        text: &str,
        add_bos: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let pipeline = if parse_special {
            &self.inner.parse
        } else {
            &self.inner.literal
        };
        let encoding = pipeline.encode_fast(text, false).map_err(backend)?;
        let ids = encoding.get_ids();
        let mut out = Vec::with_capacity(ids.len() + 1);
        if add_bos {
            out.extend(self.inner.bos);
        }
        out.extend_from_slice(ids);
        Ok(out)
    }

    /// [`Tokenizer::encode_chat_prompt`] for a prompt that holds untrusted
    /// `texts` (message contents): the template's own control tokens are
    /// parsed, but special-token text inside a content stays text, so a
    /// user cannot write `<end_of_turn>` and open the model's turn.
    ///
    /// Each text is found in the rendered prompt, in order, and tokenized
    /// with special parsing off; the template's text around them with it
    /// on. Prompts whose texts hold no special-token text are tokenized
    /// exactly as by `encode_chat_prompt`. A text that holds special-token
    /// text but cannot be found (the template rewrote it) is refused.
    pub fn encode_chat_prompt_guarded(
        &self,
        rendered: &str,
        texts: &[&str],
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = self.encode_guarded(rendered, texts)?;
        if let Some(bos) = self.inner.bos {
            if self.inner.add_bos && ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    /// Token ids of template-rendered `rendered` (no BOS added): special
    /// tokens parsed, except inside the untrusted `texts`, which stay text
    /// (see [`Tokenizer::encode_chat_prompt_guarded`]).
    pub fn encode_guarded(
        &self,
        rendered: &str,
        texts: &[&str],
    ) -> Result<Vec<u32>, TokenizerError> {
        // The special-token text each untrusted text holds, if any.
        let found: Vec<Option<&str>> = match texts {
            [] => Vec::new(),
            _ => {
                let specials = self.special_texts();
                texts.iter().map(|t| specials.first_in(t.trim())).collect()
            }
        };
        if found.iter().all(Option::is_none) {
            return self.encode(rendered, false, true);
        }
        // Byte ranges of the texts that hold special-token text.
        let mut ranges = Vec::new();
        let mut from = 0;
        for (t, special) in texts.iter().zip(found) {
            let t = t.trim();
            if t.is_empty() {
                continue;
            }
            match (rendered[from..].find(t), special) {
                (Some(at), _) => {
                    if special.is_some() {
                        ranges.push(from + at..from + at + t.len());
                    }
                    from += at + t.len();
                }
                (None, Some(special)) => {
                    return Err(TokenizerError::Backend(format!(
                        "a message holds special-token text ({special}) where the chat template changed it, so it cannot be kept as text"
                    )))
                }
                (None, None) => {}
            }
        }
        let mut ids = Vec::new();
        let mut at = 0;
        for r in ranges {
            ids.extend(self.encode(&rendered[at..r.start], false, true)?);
            ids.extend(self.encode(&rendered[r.start..r.end], false, false)?);
            at = r.end;
        }
        ids.extend(self.encode(&rendered[at..], false, true)?);
        Ok(ids)
    }

    /// The texts of the special (control) tokens, made when first needed.
    fn special_texts(&self) -> &SpecialTexts {
        self.inner.special_texts.get_or_init(|| {
            SpecialTexts::new(
                (0..self.inner.vocab_size as u32)
                    .filter(|&id| self.is_special(id))
                    .filter_map(|id| self.id_to_token(id))
                    .filter(|t| !t.is_empty()),
            )
        })
    }

    /// Token ids of a prompt rendered by a chat template: special-token text
    /// is parsed, and BOS is put first when the vocabulary wants it
    /// ([`Tokenizer::add_bos_default`]) unless the text already starts with
    /// the BOS token (templates such as Gemma's write `{{ bos_token }}`
    /// themselves), so there is never a second BOS.
    pub fn encode_chat_prompt(&self, rendered: &str) -> Result<Vec<u32>, TokenizerError> {
        // No untrusted text: every special-token text is parsed.
        self.encode_chat_prompt_guarded(rendered, &[])
    }

    /// The text of `ids`. Special (control) tokens such as BOS, EOS and
    /// end-of-turn markers are left out; all other tokens, user-defined ones
    /// included, are kept. Invalid UTF-8 from byte tokens becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        if self.inner.kind == PieceKind::Other {
            self.check_ids(ids)?;
            return self.inner.parse.decode(ids, true).map_err(backend);
        }
        let mut stream = self.stream_decoder();
        let mut out = String::new();
        for &id in ids {
            self.check_id(id)?;
            if let Some(text) = stream.push(id) {
                out.push_str(&text);
            }
        }
        if let Some(text) = stream.flush() {
            out.push_str(&text);
        }
        Ok(out)
    }

    fn check_id(&self, id: u32) -> Result<(), TokenizerError> {
        if (id as usize) < self.inner.vocab_size {
            Ok(())
        } else {
            Err(TokenizerError::IdOutOfRange {
                id,
                vocab_size: self.inner.vocab_size,
            })
        }
    }

    fn check_ids(&self, ids: &[u32]) -> Result<(), TokenizerError> {
        ids.iter().try_for_each(|&id| self.check_id(id))
    }

    /// An incremental decoder for generated ids.
    pub fn stream_decoder(&self) -> StreamDecoder {
        StreamDecoder::new(self.clone())
    }

    /// The number of token ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.vocab_size
    }

    /// The beginning-of-sequence token.
    pub fn bos_id(&self) -> Option<u32> {
        self.inner.bos
    }

    /// The end-of-sequence token.
    pub fn eos_id(&self) -> Option<u32> {
        self.inner.eos
    }

    /// The text of the BOS token (`<bos>`), for chat templates.
    pub fn bos_token(&self) -> Option<String> {
        self.inner.bos.and_then(|id| self.id_to_token(id))
    }

    /// The text of the EOS token (`<eos>`), for chat templates.
    pub fn eos_token(&self) -> Option<String> {
        self.inner.eos.and_then(|id| self.id_to_token(id))
    }

    /// Whether prompts of this model start with BOS: `tokenizer.ggml.add_bos_token`,
    /// or `add_bos_token` / the post-processor of a Hugging Face directory.
    pub fn add_bos_default(&self) -> bool {
        self.inner.add_bos
    }

    /// Whether the vocabulary asks for EOS after each text
    /// (`tokenizer.ggml.add_eos_token`). [`Tokenizer::encode`] never adds it.
    pub fn add_eos_default(&self) -> bool {
        self.inner.add_eos
    }

    /// Ids that end a generated turn: EOS, the file's end-of-turn ids
    /// (`tokenizer.ggml.eot_token_id`, `eom_token_id`), and known end-of-turn
    /// special tokens the vocabulary has (`<end_of_turn>`, `<|im_end|>`,
    /// `<|eot_id|>`, `<|endoftext|>`, ...). Sorted, without repeats.
    pub fn stop_ids(&self) -> Vec<u32> {
        self.inner.stops.clone()
    }

    /// Whether `id` is a special (control) token, left out of decoded text.
    pub fn is_special(&self, id: u32) -> bool {
        self.inner.skip.get(id as usize).copied().unwrap_or(false)
    }

    /// The text `id` stands for on its own: `▁Hello` gives `" Hello"`, `<0x0A>`
    /// gives `"\n"`, `Ġworld` gives `" world"`, a special token gives its text
    /// (`"<end_of_turn>"`). A byte token that is not a whole character gives
    /// U+FFFD; use [`Tokenizer::token_bytes`] for the raw bytes.
    pub fn token_to_piece(&self, id: u32) -> Option<String> {
        let text = self.inner.parse.id_to_token(id)?;
        if self.is_special(id) {
            return Some(text);
        }
        self.token_bytes(id)
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    /// The bytes `id` contributes to decoded text when it is not left out
    /// (for a special token: its text). `None` past the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.inner.pieces.get(id as usize).map(|b| &b[..])
    }

    /// The vocabulary entry of `id` as the model spells it (`▁Hello`, `Ġworld`, `<0x0A>`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.parse.id_to_token(id)
    }

    /// The id of a vocabulary entry spelled as the model spells it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.parse.token_to_id(token)
    }

    /// The chat template the file carries (`tokenizer.chat_template`, or
    /// `chat_template` of `tokenizer_config.json`).
    pub fn chat_template(&self) -> Option<&str> {
        self.inner.chat_template.as_deref()
    }

    /// A name for the model family, to pick a built-in chat template when the
    /// file has none: `tokenizer.ggml.pre` when it names one (`llama-bpe`,
    /// `qwen2`), else `general.architecture` (`gemma3`); for a Hugging Face
    /// directory, `model_type` of `config.json`.
    pub fn family_hint(&self) -> Option<&str> {
        self.inner.family.as_deref()
    }

    pub(crate) fn kind(&self) -> PieceKind {
        self.inner.kind
    }

    /// The text of `ids` through the `tokenizer.json` decoder (for [`PieceKind::Other`]).
    pub(crate) fn backend_decode(&self, ids: &[u32]) -> String {
        self.inner.parse.decode(ids, true).unwrap_or_default()
    }
}

/// The bytes of one token's text, as the decoder of `kind` gives them.
fn token_bytes(pipeline: &Pipeline, kind: PieceKind, text: &str) -> Vec<u8> {
    match kind {
        PieceKind::SentencePiece { .. } => {
            if let Some(b) = byte_token(text) {
                vec![b]
            } else {
                text.replace('\u{2581}', " ").into_bytes()
            }
        }
        PieceKind::ByteLevel => bpe::byte_level_decode(text),
        PieceKind::Other => {
            use tokenizers::Decoder;
            match pipeline.get_decoder() {
                Some(d) => d
                    .decode(vec![text.to_string()])
                    .unwrap_or_default()
                    .into_bytes(),
                None => text.as_bytes().to_vec(),
            }
        }
    }
}

/// `<0xNN>` as the byte NN.
pub(crate) fn byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}
