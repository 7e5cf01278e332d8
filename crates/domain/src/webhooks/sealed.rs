//! An endpoint's signing secret, sealed at rest: the row and the stored answer of its creation
//! hold it encrypted with ChaCha20-Poly1305 (`ring`'s AEAD), under a key from the settings
//! (`webhooks.sealing_key`), never in plain text.
//!
//! A sealed secret is `[format 1][key id: 4 bytes][nonce: 12 random bytes][ciphertext and tag]`.
//! The key id names the key that sealed it (the first four bytes of a SHA-256 of the key), so a
//! secret sealed under a key since replaced still opens with that key among the old ones
//! (`webhooks.old_sealing_keys`); the endpoint's id is authenticated with it (associated data),
//! so a sealed secret copied into another endpoint's row does not open there.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore as _;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use sha2::{Digest, Sha256};

use crate::ids::{self, WebhookEndpointId};

/// The first byte of every sealed secret: ChaCha20-Poly1305, a random 96-bit nonce.
const FORMAT: u8 = 1;
/// Format and key id, authenticated with the endpoint's id.
const HEADER_LEN: usize = 1 + KEY_ID_LEN;
const KEY_ID_LEN: usize = 4;
/// Random characters of a signing secret after `whsec_` (about 190 bits).
const SECRET_RANDOM_CHARS: usize = 32;

/// A signing secret in plain text (`whsec_…`): made at an endpoint's creation and shown once, or
/// opened to sign a delivery. It never prints through `Debug`.
pub struct SigningSecret(String);

impl SigningSecret {
    /// A fresh secret from the operating system's generator.
    pub fn generate() -> Self {
        Self(ids::with_random_suffix("whsec", SECRET_RANDOM_CHARS))
    }

    /// The plain text, to sign with or to show once.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningSecret(whsec_…)")
    }
}

/// A signing secret as the database and the stored answer keep it: sealed.
#[derive(Clone, PartialEq, Eq, sqlx::Type)]
#[sqlx(transparent)]
pub struct SealedSecret(Vec<u8>);

impl SealedSecret {
    /// The bytes, as stored.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// As text (URL-safe base64), for a JSON document.
    pub fn to_text(&self) -> String {
        URL_SAFE_NO_PAD.encode(&self.0)
    }

    /// From [`to_text`](Self::to_text)'s form.
    pub fn from_text(text: &str) -> Result<Self, Unsealable> {
        URL_SAFE_NO_PAD.decode(text).map(Self).map_err(|_| Unsealable::Malformed)
    }

    /// The id of the key that sealed it, if it has the shape of a sealed secret.
    pub fn key_id(&self) -> Option<KeyId> {
        let (format, id) = self.0.get(..HEADER_LEN)?.split_first()?;
        if *format != FORMAT {
            return None;
        }
        id.try_into().ok().map(KeyId)
    }
}

impl fmt::Debug for SealedSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.key_id() {
            Some(key) => write!(f, "SealedSecret(key {key})"),
            None => f.write_str("SealedSecret(malformed)"),
        }
    }
}

/// The id of a sealing key: the first four bytes of a SHA-256 of it, shown in hexadecimal.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId([u8; KEY_ID_LEN]);

impl KeyId {
    fn of(key: &[u8; 32]) -> Self {
        let digest = Sha256::new_with_prefix(b"payments webhook sealing key\0").chain_update(key);
        let mut id = [0; KEY_ID_LEN];
        id.copy_from_slice(&digest.finalize()[..KEY_ID_LEN]);
        Self(id)
    }
}

impl KeyId {
    /// The id's four bytes, as a sealed secret holds them after its format.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// Why a sealed secret does not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsealable {
    /// Not the shape of a sealed secret.
    #[error("not a sealed secret")]
    Malformed,
    /// Sealed with a key that is neither `webhooks.sealing_key` nor among the old keys.
    #[error("sealed with key {0}, which is not among the sealing keys (webhooks.old_sealing_keys)")]
    UnknownKey(KeyId),
    /// It does not authenticate: altered, or sealed for another endpoint.
    #[error("sealed secret does not authenticate (altered, or another endpoint's)")]
    Forged,
}

/// The keys that seal and open signing secrets: the current one seals, every one opens what it
/// sealed.
pub struct SealingKeys {
    /// The current key first, then the old ones.
    keys: Vec<(KeyId, LessSafeKey)>,
}

impl SealingKeys {
    /// `current` seals; it and `old` open.
    pub fn new(current: [u8; 32], old: impl IntoIterator<Item = [u8; 32]>) -> Self {
        let keys = std::iter::once(current)
            .chain(old)
            .map(|key| {
                // A 32-byte key is what ChaCha20-Poly1305 takes; no other length reaches here.
                let unbound = UnboundKey::new(&CHACHA20_POLY1305, &key)
                    .unwrap_or_else(|_| unreachable!("a ChaCha20-Poly1305 key is 32 bytes"));
                (KeyId::of(&key), LessSafeKey::new(unbound))
            })
            .collect();
        Self { keys }
    }

    /// The id of the key that seals.
    pub fn current_id(&self) -> KeyId {
        self.keys[0].0
    }

    /// `secret` sealed for `endpoint` under the current key, with a fresh nonce.
    pub fn seal(&self, secret: &SigningSecret, endpoint: &WebhookEndpointId) -> SealedSecret {
        let (id, key) = &self.keys[0];
        let mut sealed = Vec::with_capacity(HEADER_LEN + NONCE_LEN + secret.0.len() + 16);
        sealed.push(FORMAT);
        sealed.extend_from_slice(&id.0);
        let mut nonce = [0; NONCE_LEN];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        sealed.extend_from_slice(&nonce);
        let mut in_out = secret.0.as_bytes().to_vec();
        let aad = associated_data(&sealed[..HEADER_LEN], endpoint);
        // Sealing fails only past ChaCha20's 256 GiB per message.
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            &mut in_out,
        )
        .unwrap_or_else(|_| unreachable!("a secret is far below ChaCha20's bound"));
        sealed.extend_from_slice(&in_out);
        SealedSecret(sealed)
    }

    /// The secret `sealed` holds, if it was sealed for `endpoint` by one of these keys.
    pub fn open(
        &self,
        sealed: &SealedSecret,
        endpoint: &WebhookEndpointId,
    ) -> Result<SigningSecret, Unsealable> {
        let id = sealed.key_id().ok_or(Unsealable::Malformed)?;
        let body = &sealed.0[HEADER_LEN..];
        if body.len() < NONCE_LEN + CHACHA20_POLY1305.tag_len() {
            return Err(Unsealable::Malformed);
        }
        let (nonce, ciphertext) = body.split_at(NONCE_LEN);
        let aad = associated_data(&sealed.0[..HEADER_LEN], endpoint);
        let mut found = false;
        // Two different keys may share an id (one chance in four billion): each is tried.
        for (_, key) in self.keys.iter().filter(|(key_id, _)| *key_id == id) {
            found = true;
            let nonce =
                Nonce::try_assume_unique_for_key(nonce).map_err(|_| Unsealable::Malformed)?;
            let mut in_out = ciphertext.to_vec();
            if let Ok(plain) = key.open_in_place(nonce, Aad::from(&aad), &mut in_out) {
                let text = String::from_utf8(plain.to_vec()).map_err(|_| Unsealable::Forged)?;
                return Ok(SigningSecret(text));
            }
        }
        Err(if found { Unsealable::Forged } else { Unsealable::UnknownKey(id) })
    }
}

impl fmt::Debug for SealingKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<KeyId> = self.keys.iter().map(|(id, _)| *id).collect();
        f.debug_struct("SealingKeys").field("ids", &ids).finish()
    }
}

/// What is authenticated beside the ciphertext: the format, the key id, and the endpoint.
fn associated_data(header: &[u8], endpoint: &WebhookEndpointId) -> Vec<u8> {
    [header, endpoint.as_str().as_bytes()].concat()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];
    const NEXT_KEY: [u8; 32] = [8; 32];

    fn endpoint(id: &str) -> WebhookEndpointId {
        WebhookEndpointId::parse(id).unwrap()
    }

    #[test]
    fn a_sealed_secret_opens_for_its_endpoint_and_holds_no_plain_text() {
        let keys = SealingKeys::new(KEY, []);
        let secret = SigningSecret::generate();
        let sealed = keys.seal(&secret, &endpoint("we_a"));
        assert_eq!(keys.open(&sealed, &endpoint("we_a")).unwrap().expose(), secret.expose());
        let random = &secret.expose().as_bytes()["whsec_".len()..];
        assert!(!sealed.as_bytes().windows(random.len()).any(|w| w == random));
        assert!(!sealed.to_text().contains(&secret.expose()["whsec_".len()..]));
        assert_eq!(SealedSecret::from_text(&sealed.to_text()).unwrap(), sealed);
        // A fresh nonce each time: the same secret never seals to the same bytes.
        assert_ne!(keys.seal(&secret, &endpoint("we_a")), sealed);
    }

    #[test]
    fn a_secret_moved_to_another_endpoint_or_altered_does_not_open() {
        let keys = SealingKeys::new(KEY, []);
        let sealed = keys.seal(&SigningSecret::generate(), &endpoint("we_a"));
        assert_eq!(keys.open(&sealed, &endpoint("we_b")).unwrap_err(), Unsealable::Forged);
        for at in [0, 1, HEADER_LEN, HEADER_LEN + NONCE_LEN, sealed.0.len() - 1] {
            let mut altered = sealed.clone();
            altered.0[at] ^= 1;
            assert!(keys.open(&altered, &endpoint("we_a")).is_err(), "byte {at} altered");
        }
        let short = SealedSecret(sealed.0[..HEADER_LEN + NONCE_LEN].to_vec());
        assert_eq!(keys.open(&short, &endpoint("we_a")).unwrap_err(), Unsealable::Malformed);
    }

    #[test]
    fn after_a_new_key_secrets_sealed_under_the_old_one_open_while_it_is_listed() {
        let secret = SigningSecret::generate();
        let before = SealingKeys::new(KEY, []);
        let sealed = before.seal(&secret, &endpoint("we_a"));
        assert_eq!(sealed.key_id(), Some(before.current_id()));
        let rotated = SealingKeys::new(NEXT_KEY, [KEY]);
        assert_eq!(rotated.open(&sealed, &endpoint("we_a")).unwrap().expose(), secret.expose());
        let resealed = rotated.seal(&secret, &endpoint("we_a"));
        assert_eq!(resealed.key_id(), Some(rotated.current_id()));
        assert_ne!(rotated.current_id(), before.current_id());
        let forgotten = SealingKeys::new(NEXT_KEY, []);
        let err = forgotten.open(&sealed, &endpoint("we_a")).unwrap_err();
        assert_eq!(err, Unsealable::UnknownKey(before.current_id()));
        assert_eq!(forgotten.open(&resealed, &endpoint("we_a")).unwrap().expose(), secret.expose());
    }

    #[test]
    fn no_debug_prints_a_secret_or_a_key() {
        let keys = SealingKeys::new(KEY, [NEXT_KEY]);
        let secret = SigningSecret::generate();
        let sealed = keys.seal(&secret, &endpoint("we_a"));
        let printed = format!("{secret:?} {sealed:?} {keys:?}");
        assert!(!printed.contains(&secret.expose()["whsec_".len()..]), "{printed}");
        assert!(!printed.contains("7, 7") && !printed.contains("8, 8"), "{printed}");
        assert!(printed.contains(&keys.current_id().to_string()), "{printed}");
    }
}
