//! What the processor says of a new payment's PaymentIntent when its call cannot tell: the one
//! its webhook reported for the downstream key (`processor_events`), the ones its search finds
//! for the payment, or what one it answered undecided came to.

use std::time::Duration;

use idem::{Interrupted, Lease};
use provider::{CardProcessor, DownstreamKey, PaymentIntent, ProcessorError};
use serde_json::{Value, json};

use super::{Came, CreatePayment};
use crate::operations::reconcile::{
    Reconciled, count_reconciliation, refusal_may_be_stored, when_nothing_found,
};
use crate::operations::{internal, unavailable};
use crate::payments::Payment;
use crate::processor_events;

/// How long a key whose PaymentIntent the processor has not decided waits before it looks again.
pub(super) const UNDECIDED_RECHECK: Duration = Duration::from_secs(30);

impl<P: CardProcessor> CreatePayment<P> {
    /// What a PaymentIntent the processor answered undecided (`processing`, say) is now, looked
    /// up by its id, with what the lookup found for the audit. Never stored as a decline while
    /// undecided: the key waits at its call and looks again (or the webhook tells first), since
    /// the call under the same key would replay the same undecided answer. A decline it came to
    /// is the answer only where a decline the call answered would be.
    pub(super) async fn decided(
        &self,
        lease: &mut Lease,
        key: &DownstreamKey,
        undecided: PaymentIntent,
    ) -> Result<(PaymentIntent, Value), Interrupted> {
        lease.renew().await?;
        let processor = &self.ctx.processor;
        let now = processor
            .retrieve_payment_intent(&undecided.id)
            .await
            .map_err(|err| unavailable(&err))?;
        if Came::of(&now) == Came::Undecided {
            count_reconciliation("charge", "undecided");
            return Err(Interrupted::Waiting {
                detail: format!("the processor has not decided {} ({:?}) yet", now.id, now.status),
                retry_in: UNDECIDED_RECHECK,
            });
        }
        if Came::of(&now) == Came::Refused {
            refusal_may_be_stored(key, || format!("declined ({}, after it was pending)", now.id))?;
        }
        count_reconciliation("charge", "adopted");
        let found = json!({"outcome": "adopted", "cause": "undecided", "found": now.id,
                           "downstream_key": key.as_str()});
        Ok((now, found))
    }

    /// The PaymentIntent the processor's webhook says the call under `key` made, if one did
    /// (`processor_events`). One that is not this payment's is for a person, and so is a
    /// decline of a later generation, as when the call itself answers one
    /// ([`refusal_may_be_stored`]).
    pub(super) async fn pushed_intent(
        &self,
        payment: &Payment,
        key: &DownstreamKey,
    ) -> Result<Option<PaymentIntent>, Interrupted> {
        // A later generation is called only once lookups trusted that the earlier ones made
        // nothing. A webhook saying otherwise means one charge may already exist, and the call
        // under this key would make another: not for an automatic retry to decide.
        if key.generation_number() > 1
            && let Some((object_id, earlier)) =
                processor_events::paid_under_another_key(&self.ctx.pool, &payment.id, key.as_str())
                    .await
                    .map_err(internal)?
        {
            return Err(Interrupted::NeedsHuman {
                reason: format!(
                    "the processor reported {object_id} for {} under {earlier}, an earlier \
                     generation than {key}: a charge may already exist",
                    payment.id
                ),
            });
        }
        let found = processor_events::intent_for_key(&self.ctx.pool, key.as_str())
            .await
            .map_err(internal)?;
        match found {
            Some(intent)
                if !intent.is_of(&payment.id)
                    || intent.amount != payment.amount.get()
                    || payment.currency != intent.currency =>
            {
                Err(Interrupted::NeedsHuman {
                    reason: format!(
                        "the processor reported {} ({} {}) under {key}, which does not match {}",
                        intent.id, intent.amount, intent.currency, payment.id
                    ),
                })
            }
            // An event of a PaymentIntent not decided yet is no answer: the call is.
            Some(intent) if Came::of(&intent) == Came::Undecided => Ok(None),
            Some(intent) if Came::of(&intent) == Came::Refused => {
                refusal_may_be_stored(key, || {
                    format!("declined ({}, reported by the processor's webhook)", intent.id)
                })?;
                Ok(Some(intent))
            }
            found => Ok(found),
        }
    }

    /// The processor cannot tell us what the create request did: what its webhook told us, or
    /// else look for the payment's PaymentIntent. A declined one found is the answer only where
    /// a decline the call answered would be ([`refusal_may_be_stored`]): under a later
    /// generation the search may not show yet an earlier generation's authorized one.
    pub(super) async fn reconcile(
        &self,
        lease: &mut Lease,
        payment: &Payment,
        key: &DownstreamKey,
        why: &ProcessorError,
    ) -> Result<Reconciled<PaymentIntent>, Interrupted> {
        if let Some(intent) = self.pushed_intent(payment, key).await? {
            return Ok(Reconciled::Adopt(intent));
        }
        lease.renew().await?;
        let found = self
            .ctx
            .processor
            .search_payment_intents(&payment.id)
            .await
            .map_err(|err| unavailable(&err))?;
        let hits = found.len();
        let ours: Vec<PaymentIntent> =
            found.into_iter().filter(|intent| intent.is_of(&payment.id)).collect();
        // A search by our id whose hits do not carry it (a compatible server that leaves
        // `metadata` out) cannot tell ours from nothing: "nothing" would charge again.
        if ours.len() < hits {
            return Err(Interrupted::NeedsHuman {
                reason: format!(
                    "the processor's search for {} found {hits} PaymentIntents, {} of them not \
                     naming the payment ({why})",
                    payment.id,
                    hits - ours.len()
                ),
            });
        }
        // Authorized, or waiting on the customer: either may become a charge.
        let live: Vec<&PaymentIntent> = ours
            .iter()
            .filter(|intent| matches!(Came::of(intent), Came::Authorized | Came::NeedsAction))
            .collect();
        let undecided = ours.iter().find(|intent| Came::of(intent) == Came::Undecided);
        match (live.as_slice(), ours.first()) {
            ([intent], _) => Ok(Reconciled::Adopt((*intent).clone())),
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
                    "{} authorized PaymentIntents at the processor for {} ({why})",
                    several.len(),
                    payment.id
                ),
            }),
        }
    }
}
