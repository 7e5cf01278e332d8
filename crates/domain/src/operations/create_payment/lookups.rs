//! What the processor says of a new payment's charge when its call cannot tell: the charge its
//! webhook reported for the downstream key (`processor_events`), the charges its search finds
//! for the payment, or what a charge it answered undecided came to.

use std::time::Duration;

use idem::{Interrupted, Lease};
use provider::{CardProcessor, Charge, DownstreamKey, ProcessorError};
use serde_json::{Value, json};

use super::{CreatePayment, is_of};
use crate::operations::reconcile::{
    Reconciled, count_reconciliation, refusal_may_be_stored, when_nothing_found,
};
use crate::operations::{internal, unavailable};
use crate::payments::Payment;
use crate::processor_events;

/// How long a key whose charge the processor has not decided waits before it looks again.
pub(super) const UNDECIDED_RECHECK: Duration = Duration::from_secs(30);

impl<P: CardProcessor> CreatePayment<P> {
    /// What a charge the processor answered undecided (`paid=false`, status `pending`) is now,
    /// looked up by its id, with what the lookup found for the audit. Never stored as a decline
    /// while undecided: the key waits at its call and looks again (or the charge's webhook tells
    /// first), since the call under the same key would replay the same undecided answer. A
    /// decline it came to is the answer only where a decline the call answered would be.
    pub(super) async fn decided(
        &self,
        lease: &mut Lease,
        key: &DownstreamKey,
        undecided: Charge,
    ) -> Result<(Charge, Value), Interrupted> {
        lease.renew().await?;
        let processor = &self.ctx.processor;
        let now =
            processor.retrieve_charge(&undecided.id).await.map_err(|err| unavailable(&err))?;
        if !now.is_decided() {
            count_reconciliation("charge", "undecided");
            return Err(Interrupted::Waiting {
                detail: format!("the processor has not decided {} ({}) yet", now.id, now.status),
                retry_in: UNDECIDED_RECHECK,
            });
        }
        if !now.paid {
            refusal_may_be_stored(key, || format!("declined ({}, after it was pending)", now.id))?;
        }
        count_reconciliation("charge", "adopted");
        let found = json!({"outcome": "adopted", "cause": "undecided", "found": now.id,
                           "downstream_key": key.as_str()});
        Ok((now, found))
    }

    /// The charge the processor's webhook says the call under `key` made, if one did
    /// (`processor_events`). A charge that is not this payment's is for a person, and so is a
    /// decline of a later generation, as when the call itself answers one
    /// ([`refusal_may_be_stored`]).
    pub(super) async fn pushed_charge(
        &self,
        payment: &Payment,
        key: &DownstreamKey,
    ) -> Result<Option<Charge>, Interrupted> {
        // A later generation is called only once lookups trusted that the earlier ones made
        // nothing. A webhook saying otherwise means one charge may already exist, and the call
        // under this key would make another: not for an automatic retry to decide.
        if key.generation_number() > 1
            && let Some((charge_id, earlier)) =
                processor_events::paid_under_another_key(&self.ctx.pool, &payment.id, key.as_str())
                    .await
                    .map_err(internal)?
        {
            return Err(Interrupted::NeedsHuman {
                reason: format!(
                    "the processor reported {charge_id} for {} under {earlier}, an earlier \
                     generation than {key}: a charge may already exist",
                    payment.id
                ),
            });
        }
        let found = processor_events::charge_for_key(&self.ctx.pool, key.as_str())
            .await
            .map_err(internal)?;
        match found {
            Some(charge)
                if !is_of(&charge, &payment.id)
                    || charge.amount != payment.amount.get()
                    || payment.currency != charge.currency =>
            {
                Err(Interrupted::NeedsHuman {
                    reason: format!(
                        "the processor reported {} ({} {}) under {key}, which does not match {}",
                        charge.id, charge.amount, charge.currency, payment.id
                    ),
                })
            }
            Some(charge) if !charge.paid => {
                refusal_may_be_stored(key, || {
                    format!("declined ({}, reported by the processor's webhook)", charge.id)
                })?;
                Ok(Some(charge))
            }
            found => Ok(found),
        }
    }

    /// The processor cannot tell us what the charge request did: what its webhook told us, or
    /// else look for the payment's charge. A declined charge found is the answer only where a
    /// decline the call answered would be ([`refusal_may_be_stored`]): under a later generation
    /// the search may not show yet an earlier generation's successful charge.
    pub(super) async fn reconcile(
        &self,
        lease: &mut Lease,
        payment: &Payment,
        key: &DownstreamKey,
        why: &ProcessorError,
    ) -> Result<Reconciled<Charge>, Interrupted> {
        if let Some(charge) = self.pushed_charge(payment, key).await? {
            return Ok(Reconciled::Adopt(charge));
        }
        lease.renew().await?;
        let found = self
            .ctx
            .processor
            .search_charges(&payment.id)
            .await
            .map_err(|err| unavailable(&err))?;
        let ours: Vec<Charge> =
            found.into_iter().filter(|charge| is_of(charge, &payment.id)).collect();
        let paid: Vec<&Charge> = ours.iter().filter(|charge| charge.paid).collect();
        let undecided = ours.iter().find(|charge| !charge.is_decided());
        match (paid.as_slice(), ours.first()) {
            ([charge], _) => Ok(Reconciled::Adopt((*charge).clone())),
            // Not declined: the processor decides it later. A lookup that found a charge is
            // never "nothing", so the key waits rather than moving to its next generation.
            ([], Some(_)) if let Some(undecided) = undecided => {
                count_reconciliation("charge", "undecided");
                Err(Interrupted::Waiting {
                    detail: format!("the processor has not decided {} yet", undecided.id),
                    retry_in: UNDECIDED_RECHECK,
                })
            }
            // Declined: no money moved, and the decline is the answer (under the first
            // generation: under a later one, an earlier call may have charged the card).
            ([], Some(failed)) => {
                refusal_may_be_stored(key, || {
                    format!("declined ({}, found by the processor's search; {why})", failed.id)
                })?;
                Ok(Reconciled::Adopt(failed.clone()))
            }
            ([], None) => {
                let processor = &self.ctx.processor;
                when_nothing_found(
                    lease,
                    processor.longest_call(),
                    processor.search_lag(),
                    "charge",
                )
                .await
            }
            (several, _) => Err(Interrupted::NeedsHuman {
                reason: format!(
                    "{} successful charges at the processor for {} ({why})",
                    several.len(),
                    payment.id
                ),
            }),
        }
    }
}
