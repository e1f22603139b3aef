//! The one `POST /orders` handler body every variant serves, byte for byte.

use std::sync::Arc;
use std::time::SystemTime;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use dashmap::DashMap;
use serde::{Deserialize, Serialize};

/// How many ways the orders map is sharded: enough that a shard's growth (a rehash under
/// its write lock) never stalls both workers at once.
pub const SHARDS: usize = 64;

/// The request body: `{"customer_id": "...", "amount_minor": n}`.
#[derive(Deserialize)]
pub struct CreateOrder {
    /// Who orders.
    pub customer_id: String,
    /// How much, in minor units.
    pub amount_minor: i64,
}

/// An order, as the map keeps it and as the 201 answers it (about 150 bytes of JSON).
#[derive(Serialize)]
pub struct Order {
    /// `ord_` and a UUID v7 in simple form.
    pub id: String,
    /// Who ordered.
    pub customer_id: String,
    /// How much, in minor units.
    pub amount_minor: i64,
    /// Always `"created"`.
    pub status: &'static str,
    /// RFC 3339, milliseconds, UTC.
    pub created_at: String,
}

/// The in-memory orders, by id.
pub type Orders = Arc<DashMap<String, Order>>;

/// An empty orders map, sharded [`SHARDS`] ways.
#[must_use]
pub fn orders() -> Orders {
    Arc::new(DashMap::with_shard_amount(SHARDS))
}

/// The handler's body: a new order inserted, answered 201 with its JSON and
/// `Location: /orders/<id>`.
pub fn create(orders: &Orders, body: CreateOrder) -> Response {
    let id = format!("ord_{}", uuid::Uuid::now_v7().simple());
    let order = Order {
        id: id.clone(),
        customer_id: body.customer_id,
        amount_minor: body.amount_minor,
        status: "created",
        created_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
    };
    let (Ok(json), Ok(location)) = (
        serde_json::to_vec(&order),
        HeaderValue::from_str(&format!("/orders/{id}")),
    ) else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    orders.insert(id, order);
    (
        StatusCode::CREATED,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::LOCATION, location),
        ],
        json,
    )
        .into_response()
}
