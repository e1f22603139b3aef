//! The SQL stores: SQLite and PostgreSQL.

#[cfg(feature = "postgres")]
pub mod postgres;
mod rows;
#[cfg(feature = "sqlite")]
pub mod sqlite;
