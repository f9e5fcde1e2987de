//! One file per subcommand.

pub mod bench;
pub mod chat;
pub mod decide;
pub mod embed;
pub mod perplexity;
pub mod plan;
pub mod pull;
pub mod pull_embedding;
pub mod run;
pub mod score;
pub mod serve;
pub mod tokenize;
