//! The user's `Cargo.toml`, read for one fact: the name diesel-inbox is a dependency
//! under. A renamed dependency (`inbox = { package = "diesel-inbox" }`) is then found
//! without `crate = …`, and a misspelt `crate = ::inboxx` reported once, with the name
//! to write, rather than at every path of the expansion.

use std::path::Path;

/// The package this crate is the attribute of.
const PACKAGE: &str = "diesel-inbox";

/// The dependencies a manifest declares, as `(name in code, package)`.
pub(crate) struct Dependencies(Vec<(String, String)>);

impl Dependencies {
    /// The manifest of the crate being compiled, if Cargo says where it is and it reads.
    /// A build without Cargo, or a manifest this reader does not follow, gives `None`,
    /// and the attribute then checks nothing against it.
    pub(crate) fn of_crate() -> Option<Self> {
        let dir = std::env::var_os("CARGO_MANIFEST_DIR")?;
        let text = std::fs::read_to_string(Path::new(&dir).join("Cargo.toml")).ok()?;
        Some(Self::parse(&text))
    }

    /// The tables `[dependencies]`, `[dev-dependencies]`, `[build-dependencies]` and
    /// their `[target.….…]` forms, with one line per dependency, and the
    /// `[dependencies.name]` form.
    fn parse(text: &str) -> Self {
        let mut dependencies = Vec::new();
        // In `[…dependencies]`: `None`; in `[…dependencies.name]`: that name.
        let mut table: Option<Option<String>> = None;
        // A commented-out dependency is not one: taken for a rename, it would send the
        // expansion to a crate that is not there.
        let lines = text
            .lines()
            .map(str::trim)
            .filter(|line| !line.starts_with('#'));
        for line in lines {
            if let Some(header) = line.strip_prefix('[') {
                let header = header.trim_end_matches(']').trim();
                table = dependency_table(header);
                if let Some(Some(name)) = &table {
                    dependencies.push((code_name(name), name.clone()));
                }
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let (key, value) = (unquote(key.trim()), value.trim());
            match &table {
                Some(None) => {
                    let package = inline_package(value).unwrap_or_else(|| key.to_owned());
                    dependencies.push((code_name(key), package));
                }
                Some(Some(_)) if key == "package" => {
                    if let Some(last) = dependencies.last_mut() {
                        last.1 = unquote(value).to_owned();
                    }
                }
                _ => {}
            }
        }
        Self(dependencies)
    }

    /// The name diesel-inbox is a dependency under, as code writes it.
    pub(crate) fn diesel_inbox(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(_, package)| package == PACKAGE)
            .map(|(name, _)| name.as_str())
    }

    /// Whether `name`, as code writes it, is a dependency.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.0.iter().any(|(dependency, _)| dependency == name)
    }
}

/// For a table header, `Some(None)` for a dependency table, `Some(Some(name))` for one
/// dependency's own table, `None` for any other table.
fn dependency_table(header: &str) -> Option<Option<String>> {
    let header = header.strip_prefix("target.").map_or(header, |rest| {
        // `target.'cfg(unix)'.dependencies`: the part after the quoted target.
        rest.rsplit_once(['\'', '"'])
            .map_or(rest, |(_, tail)| tail.trim_start_matches('.'))
    });
    let (kind, name) = match header.split_once('.') {
        Some((kind, name)) => (kind, Some(unquote(name.trim()).to_owned())),
        None => (header, None),
    };
    matches!(
        kind,
        "dependencies" | "dev-dependencies" | "build-dependencies"
    )
    .then_some(name)
}

/// `package = "…"` inside an inline table.
fn inline_package(value: &str) -> Option<String> {
    let inner = value.strip_prefix('{')?;
    inner.split(',').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key.trim() == "package")
            .then(|| unquote(value.trim().trim_end_matches('}').trim()).to_owned())
    })
}

fn unquote(text: &str) -> &str {
    text.trim_matches(['"', '\''])
}

/// The name code uses for a dependency: Cargo turns `-` into `_`.
fn code_name(name: &str) -> String {
    name.replace('-', "_")
}

#[cfg(test)]
mod tests {
    use super::Dependencies;

    #[test]
    fn a_renamed_dependency_is_found_in_every_form() {
        let inline = Dependencies::parse(
            "[package]\nname = \"svc\"\n\n[dependencies]\ntokio = \"1\"\n\
             inbox = { package = \"diesel-inbox\", version = \"0.1\", features = [\"postgres\"] }\n",
        );
        assert_eq!(inline.diesel_inbox(), Some("inbox"));
        assert!(inline.contains("tokio"));

        let table = Dependencies::parse(
            "[dependencies.exactly-once]\npackage = \"diesel-inbox\"\nversion = \"0.1\"\n",
        );
        assert_eq!(table.diesel_inbox(), Some("exactly_once"));

        let target = Dependencies::parse(
            "[target.'cfg(unix)'.dependencies]\ninbox = { package = \"diesel-inbox\" }\n",
        );
        assert_eq!(target.diesel_inbox(), Some("inbox"));
    }

    #[test]
    fn a_dependency_under_its_own_name_is_found() {
        let plain = Dependencies::parse("[dependencies]\ndiesel-inbox = { version = \"0.1\" }\n");
        assert_eq!(plain.diesel_inbox(), Some("diesel_inbox"));
        let table = Dependencies::parse("[dev-dependencies.diesel-inbox]\npath = \"..\"\n");
        assert_eq!(table.diesel_inbox(), Some("diesel_inbox"));
    }

    #[test]
    fn a_commented_out_rename_is_not_a_dependency() {
        let manifest = Dependencies::parse(
            "[dependencies]\n# inbox = { package = \"diesel-inbox\" }\ndiesel-inbox = \"0.1\"\n",
        );
        assert_eq!(manifest.diesel_inbox(), Some("diesel_inbox"));
    }

    #[test]
    fn other_tables_are_not_dependencies() {
        let manifest = Dependencies::parse(
            "[package]\nname = \"diesel-inbox\"\n[features]\ninbox = [\"diesel-inbox/postgres\"]\n",
        );
        assert_eq!(manifest.diesel_inbox(), None);
        assert!(!manifest.contains("name"));
    }
}
