//! Streaming responses: a job's pieces written out as server-sent events
//! (OpenAI's chunk objects, an optional usage chunk, then `[DONE]`).

use std::convert::Infallible;

use axum::response::sse::Event as SseEvent;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::generation::{DraftCounts, Piece};
use crate::replies::{logprobs_json, tool_call_json, usage, Kind};
use crate::Shared;

/// Writes a job's pieces as server-sent events.
pub(crate) struct Streamer {
    pub(crate) state: Shared,
    pub(crate) kind: Kind,
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) n: usize,
    pub(crate) prompt_tokens: usize,
    pub(crate) include_usage: bool,
    pub(crate) want_logprobs: bool,
    /// A completion's prompt, sent ahead of each choice's first text
    /// (`echo`).
    pub(crate) echo: Option<String>,
}

impl Streamer {
    fn chunk(&self, choice: Value) -> SseEvent {
        let mut body = json!({
            "id": self.id,
            "object": self.kind.object(true),
            "created": self.created,
            "model": self.state.model_name,
            "choices": [choice],
        });
        if self.include_usage {
            body["usage"] = Value::Null;
        }
        SseEvent::default().data(body.to_string())
    }

    fn delta(&self, index: usize, text: &str, first: bool, finish: Option<&str>) -> Value {
        match self.kind {
            Kind::Chat => {
                let mut delta = json!({});
                if first {
                    delta["role"] = json!("assistant");
                }
                if !text.is_empty() || first {
                    delta["content"] = json!(text);
                }
                json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
            Kind::Completion => {
                let text = match (&self.echo, first) {
                    (Some(echo), true) => format!("{echo}{text}"),
                    _ => text.to_string(),
                };
                json!({"index": index, "text": text, "logprobs": null, "finish_reason": finish})
            }
        }
    }

    pub(crate) async fn run(
        self,
        mut rx: mpsc::Receiver<Piece>,
        tx: mpsc::Sender<Result<SseEvent, Infallible>>,
    ) {
        let mut started = vec![false; self.n];
        let mut offsets = vec![0usize; self.n];
        let mut completion_tokens = 0;
        let mut drafts = DraftCounts::default();
        let mut done = 0;
        while done < self.n {
            // A client that goes away while nothing is generated yet (its
            // request still queued) is noticed here: returning drops `rx`,
            // which cancels every choice.
            let piece = tokio::select! {
                p = rx.recv() => p,
                _ = tx.closed() => return,
            };
            let Some(piece) = piece else {
                return;
            };
            let event = match piece {
                Piece::Delta {
                    index,
                    text,
                    tokens,
                } => {
                    let first = !std::mem::replace(&mut started[index], true);
                    let mut choice = self.delta(index, &text, first, None);
                    if self.want_logprobs && !tokens.is_empty() {
                        choice["logprobs"] =
                            logprobs_json(&self.state, self.kind, &tokens, offsets[index]);
                    }
                    offsets[index] += text.len();
                    self.chunk(choice)
                }
                Piece::Reasoning { index, text } => {
                    let first = !std::mem::replace(&mut started[index], true);
                    let mut delta = json!({ "reasoning_content": text });
                    if first {
                        delta["role"] = json!("assistant");
                    }
                    self.chunk(json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": null}))
                }
                Piece::ToolCalls { index, calls } => {
                    // Each call as two deltas: its id and name, then its
                    // arguments (the calls are complete when they arrive).
                    for (i, call) in calls.iter().enumerate() {
                        let first = !std::mem::replace(&mut started[index], true);
                        let mut head = tool_call_json(call, Some(i));
                        head["function"]["arguments"] = json!("");
                        let mut delta = json!({ "tool_calls": [head] });
                        if first {
                            delta["role"] = json!("assistant");
                            delta["content"] = Value::Null;
                        }
                        let choice = json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": null});
                        if tx.send(Ok(self.chunk(choice))).await.is_err() {
                            return;
                        }
                        let args = json!({"tool_calls": [{"index": i, "function": {"arguments": call.arguments}}]});
                        let choice = json!({"index": index, "delta": args, "logprobs": null, "finish_reason": null});
                        if tx.send(Ok(self.chunk(choice))).await.is_err() {
                            return;
                        }
                    }
                    continue;
                }
                Piece::Done {
                    index,
                    finish_reason,
                    completion_tokens: c,
                    drafts: d,
                } => {
                    done += 1;
                    completion_tokens += c;
                    drafts += d;
                    let first = !std::mem::replace(&mut started[index], true);
                    self.chunk(self.delta(index, "", first, Some(finish_reason)))
                }
                Piece::Failed { error, .. } => {
                    let body = json!({"error": {"message": error.message, "type": error.kind(), "param": error.param, "code": error.status.as_u16()}});
                    let _ = tx
                        .send(Ok(SseEvent::default().data(body.to_string())))
                        .await;
                    break;
                }
            };
            if tx.send(Ok(event)).await.is_err() {
                // The client went away: dropping `rx` cancels every choice.
                return;
            }
        }
        if self.include_usage {
            let body = json!({
                "id": self.id,
                "object": self.kind.object(true),
                "created": self.created,
                "model": self.state.model_name,
                "choices": [],
                "usage": usage(self.prompt_tokens, completion_tokens, drafts),
            });
            let _ = tx
                .send(Ok(SseEvent::default().data(body.to_string())))
                .await;
        }
        let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
    }
}
