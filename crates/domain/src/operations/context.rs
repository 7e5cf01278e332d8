//! What every operation needs: the database, the processor, and how it is configured.

use std::collections::BTreeMap;
use std::sync::Arc;

use idem::batch::Batcher;
use sqlx::PgPool;

use crate::authentication::AuthenticationSettings;
use crate::payments;
use crate::webhooks::SealingKeys;

/// What every operation needs.
pub struct Context<P> {
    /// The database.
    pub pool: PgPool,
    /// The card processor.
    pub processor: Arc<P>,
    /// The base of problem `type` links in stored answers.
    pub public_base_url: Arc<str>,
    /// The keys that seal webhook endpoints' signing secrets (`webhooks.sealing_key`).
    pub sealing_keys: Arc<SealingKeys>,
    /// Further `metadata[…]` members for every new charge (`processor.charge_metadata`).
    pub charge_metadata: Arc<BTreeMap<String, String>>,
    /// The batches the last phase of new payments share (`idem::batch`), or `None` to send each
    /// alone (`idempotency.batch_phases`).
    pub charged: Option<Batcher<payments::batch::Charged>>,
    /// Whether a new payment's phases take the fast path, one statement each where they can
    /// (`operations/create_payment/fast_path.rs`), or the reference road, a transaction each
    /// (`idempotency.fast_path`). Both write the same.
    pub fast_path: bool,
    /// How a payment that waits on its customer is sent on and looked after.
    pub authentication: AuthenticationSettings,
}

impl<P> Context<P> {
    /// A context with no further charge metadata, whose phases go in batches.
    pub fn new(
        pool: PgPool,
        processor: Arc<P>,
        public_base_url: Arc<str>,
        sealing_keys: Arc<SealingKeys>,
    ) -> Self {
        let charged = Some(Batcher::new(pool.clone(), payments::batch::Charged));
        let charge_metadata = Arc::default();
        let authentication = AuthenticationSettings::new(&public_base_url);
        Self {
            pool,
            processor,
            public_base_url,
            sealing_keys,
            charge_metadata,
            charged,
            fast_path: true,
            authentication,
        }
    }

    /// The same, with a new payment's phases on the fast path or the reference road.
    pub fn with_fast_path(self, fast_path: bool) -> Self {
        Self { fast_path, ..self }
    }

    /// The same, with `metadata` sent with every new charge.
    pub fn with_charge_metadata(self, metadata: BTreeMap<String, String>) -> Self {
        Self { charge_metadata: Arc::new(metadata), ..self }
    }

    /// The same, with these authentication settings.
    pub fn with_authentication(self, authentication: AuthenticationSettings) -> Self {
        Self { authentication, ..self }
    }

    /// The same, with phases sent in batches or each alone.
    pub fn with_batches(self, batches: bool) -> Self {
        let charged = batches.then(|| Batcher::new(self.pool.clone(), payments::batch::Charged));
        Self { charged, ..self }
    }
}

impl<P> Clone for Context<P> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            processor: self.processor.clone(),
            public_base_url: self.public_base_url.clone(),
            sealing_keys: self.sealing_keys.clone(),
            charge_metadata: self.charge_metadata.clone(),
            charged: self.charged.clone(),
            fast_path: self.fast_path,
            authentication: self.authentication.clone(),
        }
    }
}

impl<P> std::fmt::Debug for Context<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("public_base_url", &self.public_base_url)
            .finish_non_exhaustive()
    }
}
