//! The two request forms `/v1/decide` and `spindle decide -f` accept.
//!
//! - The list form (Spindle's own): `"questions": [{"id", "kind", ...}]`.
//! - The map form (as other decision APIs take it): `"questions": {"<id>":
//!   {"type", "options", "question", "instructions", "criteria"}}`; its
//!   answers come back keyed by id under `answers`.
//!
//! Both become one [`DecisionRequest`]; the map keeps its order.

use serde_json::{Map, Value};

use super::{DecideError, DecisionRequest};

/// Which form a request came in, so the answer can take the same form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    List,
    Map,
}

/// Reads a decision request in either form. Fields it does not know
/// (`model`, `user`, ...) are left to the caller, as the list form leaves
/// them.
pub fn parse_request(mut body: Value) -> Result<(DecisionRequest, Form), DecideError> {
    let bad = |m: String| DecideError::Malformed(m);
    let obj = body
        .as_object_mut()
        .ok_or_else(|| bad("the request must be a JSON object".into()))?;
    let form = match obj.get_mut("questions") {
        Some(Value::Object(map)) => {
            let list = std::mem::take(map)
                .into_iter()
                .map(|(id, q)| keyed_question(id, q))
                .collect::<Result<Vec<_>, _>>()?;
            obj.insert("questions".into(), Value::Array(list));
            Form::Map
        }
        Some(Value::Array(_)) => Form::List,
        Some(_) => {
            return Err(bad(
                "'questions' must be a list of questions or a map from id to question".into(),
            ))
        }
        None => return Err(bad("give 'questions': the questions to decide".into())),
    };
    let req =
        serde_json::from_value(body).map_err(|e| bad(format!("invalid decision request: {e}")))?;
    Ok((req, form))
}

/// One question of the map form as the list form writes it: the key as
/// `id`, `type` as `kind`.
fn keyed_question(id: String, q: Value) -> Result<Value, DecideError> {
    let Value::Object(mut q) = q else {
        return Err(DecideError::Malformed(format!(
            "question '{id}' must be an object with a 'type'"
        )));
    };
    if q.contains_key("id") {
        return Err(DecideError::Malformed(format!(
            "question '{id}' has an 'id' of its own: in the map form the key is the id"
        )));
    }
    let kind = match (q.remove("type"), q.remove("kind")) {
        (Some(k), None) | (None, Some(k)) => k,
        (Some(_), Some(_)) => {
            return Err(DecideError::Malformed(format!(
                "question '{id}' has both 'type' and 'kind': give one"
            )))
        }
        (None, None) => {
            return Err(DecideError::Malformed(format!(
                "question '{id}' has no 'type': give choice, yes_no, noul or score"
            )))
        }
    };
    let mut out = Map::new();
    out.insert("id".into(), Value::String(id));
    out.insert("kind".into(), kind);
    out.extend(q);
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::Kind;
    use serde_json::json;

    #[test]
    fn the_map_form_becomes_the_list_form_in_order() {
        let (req, form) = parse_request(json!({
            "state": "s",
            "questions": {
                "next_action": {"type": "choice", "options": ["a", "b"], "instructions": "Be careful."},
                "is_down": {"type": "noul"},
                "severity": {"type": "score", "criteria": "how bad it is"}
            }
        }))
        .unwrap();
        assert_eq!(form, Form::Map);
        let ids: Vec<&str> = req.questions.iter().map(|q| q.id.as_str()).collect();
        assert_eq!(ids, ["next_action", "is_down", "severity"]);
        assert_eq!(req.questions[0].kind, Kind::Choice);
        assert_eq!(
            req.questions[0].instructions.as_deref(),
            Some("Be careful.")
        );
        assert_eq!(req.questions[1].kind, Kind::Noul);
        assert_eq!(req.questions[2].criteria.as_deref(), Some("how bad it is"));
        let (_, form) =
            parse_request(json!({"state": "s", "questions": [{"id": "x", "kind": "yes_no"}]}))
                .unwrap();
        assert_eq!(form, Form::List);
    }

    #[test]
    fn malformed_map_questions_are_named() {
        let err = |v: Value| parse_request(v).unwrap_err().to_string();
        assert!(
            err(json!({"state": "s", "questions": {"q": {"options": []}}}))
                .contains("'q' has no 'type'")
        );
        assert!(err(json!({"state": "s", "questions": {"q": 3}})).contains("'q' must be an object"));
        assert!(
            err(json!({"state": "s", "questions": {"q": {"type": "maybe"}}})).contains("maybe")
        );
        assert!(err(json!({"state": "s", "questions": 5})).contains("list of questions or a map"));
        assert!(err(json!({"state": "s"})).contains("give 'questions'"));
        assert!(
            err(json!({"state": "s", "questions": {"q": {"type": "noul", "id": "r"}}}))
                .contains("key is the id")
        );
    }
}
