//! `spindle tokenize` and `spindle detokenize`.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

use crate::options::{parse_ids, read_bytes_arg, read_text_arg, ModelPathArgs};

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    #[command(flatten)]
    pub model: ModelPathArgs,
    /// Do not add the BOS token (added by default when the model's metadata
    /// asks for it).
    #[arg(long = "no-bos")]
    pub no_bos: bool,
    /// Treat special-token text (like `<start_of_turn>`) as plain text.
    #[arg(long = "no-special")]
    pub no_special: bool,
    /// Read the text from this file (`-`: standard input), byte for byte
    /// (bytes that are not UTF-8 are tokenized as llama-tokenize does).
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        conflicts_with = "text"
    )]
    pub file: Option<PathBuf>,
    /// The text; `-` reads it from standard input, byte for byte (a final
    /// newline is tokenized too).
    pub text: Option<String>,
}

#[derive(Args, Debug)]
pub struct DetokenizeArgs {
    #[command(flatten)]
    pub model: ModelPathArgs,
    /// Read the ids from this file (`-`: standard input).
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        conflicts_with = "ids"
    )]
    pub file: Option<PathBuf>,
    /// Token ids: "2,818,1234" or "[2, 818, 1234]" (the output of
    /// `tokenize`); `-` reads them from standard input.
    pub ids: Option<String>,
}

/// The positional argument, `-` meaning standard input, or `-f FILE`.
fn input(positional: &Option<String>, file: &Option<PathBuf>) -> Result<String> {
    match (positional, file) {
        (Some(t), None) if t == "-" => read_text_arg("-", &PathBuf::from("-")),
        (Some(t), None) => Ok(t.clone()),
        (None, Some(f)) => read_text_arg("-f", f),
        // clap refuses both.
        (Some(_), Some(_)) => bail!("give the input once: as an argument or with -f"),
        (None, None) => {
            bail!("no input: give it as an argument, `-` for standard input, or -f FILE")
        }
    }
}

/// [`input`] as bytes: a file or standard input need not be UTF-8.
fn input_bytes(positional: &Option<String>, file: &Option<PathBuf>) -> Result<Vec<u8>> {
    match (positional, file) {
        (Some(t), None) if t == "-" => read_bytes_arg("-", &PathBuf::from("-")),
        (None, Some(f)) => read_bytes_arg("-f", f),
        _ => Ok(input(positional, file)?.into_bytes()),
    }
}

pub fn tokenize(args: TokenizeArgs) -> Result<()> {
    let text = input_bytes(&args.text, &args.file)?;
    let tok = args.model.load_tokenizer()?;
    // Bytes that are not UTF-8 are tokenized as llama-tokenize does.
    let ids = tok.encode_bytes(
        &text,
        // BOS as the file says (`tokenizer.ggml.add_bos_token`), as
        // llama-tokenize does: Qwen and gpt-oss prompts start without one.
        !args.no_bos && tok.add_bos_default(),
        !args.no_special,
    )?;
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}

pub fn detokenize(args: DetokenizeArgs) -> Result<()> {
    let ids = parse_ids(&input(&args.ids, &args.file)?)?;
    let tok = args.model.load_tokenizer()?;
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= tok.vocab_size()) {
        bail!(
            "token id {bad} is outside the vocabulary of {}",
            tok.vocab_size()
        );
    }
    println!("{}", tok.decode(&ids)?);
    Ok(())
}
