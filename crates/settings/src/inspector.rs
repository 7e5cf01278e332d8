//! `[inspector]`: whether the operator's page is served, the token it asks for, and where its
//! links to the guide point.

use secrecy::SecretString;
use serde::Deserialize;

/// `[inspector]`
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InspectorSettings {
    /// Serve `/inspector`.
    pub enabled: bool,
    /// The operator token the page asks for. Never logged.
    pub token: SecretString,
    /// Where the guide (`docs/`) is published, e.g. a repository's web view; its links are this
    /// followed by `/docs/…`. Empty: the inspector names the guide's files by their path in the
    /// repository instead of linking them.
    pub docs_base_url: String,
}

impl std::fmt::Debug for InspectorSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InspectorSettings")
            .field("enabled", &self.enabled)
            .field("docs_base_url", &self.docs_base_url)
            .finish_non_exhaustive()
    }
}

/// The shortest operator token accepted.
pub const INSPECTOR_TOKEN_MIN_CHARS: usize = 16;
