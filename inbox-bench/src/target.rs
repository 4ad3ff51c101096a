//! Where a backend's measurements run: a PostgreSQL schema, a MySQL database or an SQLite
//! file of the run's own. The library always names its table `inbox`, so isolation from
//! other users of the same server comes from the schema or database.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::Context as _;
use diesel_async::{
    AsyncConnection, AsyncMysqlConnection, AsyncPgConnection, SimpleAsyncConnection,
};
use tempfile::TempDir;

use crate::backend::Backend;

pub enum Target {
    Postgres {
        url: String,
        schema: String,
    },
    Mysql {
        server_url: String,
        url: String,
        database: String,
    },
    Sqlite {
        path: PathBuf,
        /// Holds the database and its WAL; removed with them when dropped.
        dir: TempDir,
    },
}

impl Target {
    /// The target for `backend`, or why it is skipped.
    pub fn from_env(backend: Backend) -> anyhow::Result<Result<Self, String>> {
        // The pid keeps concurrent runs (a smoke test beside a real run) apart, the
        // counter runs within one process (the smoke tests).
        static TARGETS: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "inbox_bench_{}_{}",
            std::process::id(),
            TARGETS.fetch_add(1, Ordering::Relaxed)
        );
        let server_url = |variable: &str, example: &str| match std::env::var(variable) {
            Ok(url) if !url.is_empty() => Ok(url),
            _ => Err(format!(
                "skipping {}: {variable} is not set (for example {variable}={example})",
                backend.name()
            )),
        };
        Ok(match backend {
            Backend::Postgres => {
                server_url("POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")
                    .map(|url| Self::Postgres { url, schema: name })
            }
            Backend::Mysql => {
                server_url("MYSQL_URL", "mysql://root@127.0.0.1:3306/test").map(|server_url| {
                    Self::Mysql {
                        url: with_database(&server_url, &name),
                        server_url,
                        database: name,
                    }
                })
            }
            Backend::Sqlite => {
                let dir = tempfile::Builder::new()
                    .prefix("inbox-bench-")
                    .tempdir()
                    .context("create a temporary directory for SQLite")?;
                Ok(Self::Sqlite {
                    path: dir.path().join("bench.sqlite3"),
                    dir,
                })
            }
        })
    }

    pub fn backend(&self) -> Backend {
        match self {
            Self::Postgres { .. } => Backend::Postgres,
            Self::Mysql { .. } => Backend::Mysql,
            Self::Sqlite { .. } => Backend::Sqlite,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Self::Postgres { schema, .. } => format!("PostgreSQL, schema {schema}"),
            Self::Mysql { database, .. } => format!("MySQL/MariaDB, database {database}"),
            Self::Sqlite { path, .. } => format!("SQLite, file {}", path.display()),
        }
    }

    /// Creates the schema or database (dropping a leftover of a crashed run first).
    pub async fn create(&self) -> anyhow::Result<()> {
        match self {
            Self::Postgres { url, schema } => {
                let mut conn = AsyncPgConnection::establish(url)
                    .await
                    .context("connect to PostgreSQL")?;
                conn.batch_execute(&format!(
                    "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
                ))
                .await?;
            }
            Self::Mysql {
                server_url,
                database,
                ..
            } => {
                let mut conn = AsyncMysqlConnection::establish(server_url)
                    .await
                    .context("connect to MySQL")?;
                conn.batch_execute(&format!(
                    "DROP DATABASE IF EXISTS {database}; CREATE DATABASE {database}"
                ))
                .await?;
            }
            Self::Sqlite { .. } => {}
        }
        Ok(())
    }

    /// Drops what [`Target::create`] and the measurements made.
    pub async fn remove(self) -> anyhow::Result<()> {
        match self {
            Self::Postgres { url, schema } => {
                let mut conn = AsyncPgConnection::establish(&url).await?;
                conn.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                    .await?;
            }
            Self::Mysql {
                server_url,
                database,
                ..
            } => {
                let mut conn = AsyncMysqlConnection::establish(&server_url).await?;
                conn.batch_execute(&format!("DROP DATABASE IF EXISTS {database}"))
                    .await?;
            }
            Self::Sqlite { dir, .. } => dir.close().context("remove the SQLite directory")?,
        }
        Ok(())
    }

    /// The URL a connection opens, and the statements that set up its session.
    pub fn connection(&self) -> (String, String) {
        match self {
            Self::Postgres { url, schema } => (url.clone(), format!("SET search_path TO {schema}")),
            Self::Mysql { url, .. } => (url.clone(), String::new()),
            // The busy timeout first, so that it covers the switch to WAL (see the README).
            Self::Sqlite { path, .. } => (
                path.to_string_lossy().into_owned(),
                "PRAGMA busy_timeout = 10000; PRAGMA journal_mode = WAL;".to_owned(),
            ),
        }
    }
}

/// `mysql://user@host:3306/db?options` with its database replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let (base, options) = match url.split_once('?') {
        Some((base, options)) => (base, Some(options)),
        None => (url, None),
    };
    let authority = base.find("://").map_or(0, |scheme| scheme + 3);
    let path = base[authority..]
        .find('/')
        .map_or(base.len(), |slash| authority + slash);
    let mut replaced = format!("{}/{database}", &base[..path]);
    if let Some(options) = options {
        replaced.push('?');
        replaced.push_str(options);
    }
    replaced
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn mysql_database_is_replaced() {
        assert_eq!(
            with_database("mysql://root@127.0.0.1:3306/test", "b"),
            "mysql://root@127.0.0.1:3306/b"
        );
        assert_eq!(
            with_database("mysql://root@h:3306?ssl-mode=disabled", "b"),
            "mysql://root@h:3306/b?ssl-mode=disabled"
        );
    }
}
