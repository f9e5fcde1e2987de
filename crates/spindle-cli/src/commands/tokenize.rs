//! `spindle tokenize` and `spindle detokenize`.

use anyhow::Result;
use clap::Args;

use crate::options::{parse_ids, ModelArgs};

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Do not add the BOS token.
    #[arg(long = "no-bos")]
    pub no_bos: bool,
    /// Treat special-token text (like `<start_of_turn>`) as plain text.
    #[arg(long = "no-special")]
    pub no_special: bool,
    pub text: String,
}

#[derive(Args, Debug)]
pub struct DetokenizeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Token ids: "2,818,1234" or "[2, 818, 1234]".
    pub ids: String,
}

pub fn tokenize(args: TokenizeArgs) -> Result<()> {
    let tok = args.model.load_tokenizer()?;
    let ids = tok.encode(
        &args.text,
        !args.no_bos && tok.bos_id().is_some(),
        !args.no_special,
    )?;
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}

pub fn detokenize(args: DetokenizeArgs) -> Result<()> {
    let ids = parse_ids(&args.ids)?;
    let tok = args.model.load_tokenizer()?;
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= tok.vocab_size()) {
        anyhow::bail!(
            "token id {bad} is outside the vocabulary of {}",
            tok.vocab_size()
        );
    }
    println!("{}", tok.decode(&ids)?);
    Ok(())
}
