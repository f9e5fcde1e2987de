//! `GET /v1/models`, and the check that a request names the served model.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::{AppState, Shared};

pub(crate) fn check_model(state: &AppState, model: &str) -> Result<(), ApiError> {
    if model == state.model_name {
        Ok(())
    } else {
        Err(ApiError {
            param: Some("model"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "the model '{model}' does not exist: this server serves '{}'",
                    state.model_name
                ),
            )
        })
    }
}

pub(crate) async fn models(State(state): State<Shared>) -> Json<Value> {
    let mut data = vec![json!({
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "spindle",
        "max_model_len": state.engine.ctx,
    })];
    if let Some(e) = &state.embedder {
        let e = e.embedder();
        data.push(json!({
            "id": e.name,
            "object": "model",
            "created": state.created,
            "owned_by": "spindle",
            "max_model_len": e.max_tokens(),
            "embedding_dimensions": e.dimensions(),
            "cross_encoder": e.is_cross_encoder(),
        }));
    }
    Json(json!({"object": "list", "data": data}))
}
