//! Stripe's test payment methods, as the stand-in knows them: each `pm_card_…` (and the older
//! `tok_…` form, where Stripe has one) decides how a charge or a PaymentIntent's confirmation
//! ends, as the test card behind it does at Stripe.

/// How a card issuer declines, as a 402 `card_error` tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decline {
    /// The error's `code` (and the charge's `failure_code`).
    pub code: &'static str,
    /// The error's `decline_code` (and the charge's `outcome.reason`).
    pub decline_code: &'static str,
    /// The error's `message` (and the charge's `failure_message`).
    pub message: &'static str,
}

/// What a test payment method does when it is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenOutcome {
    /// The charge is authorized.
    Succeeds,
    /// The issuer declines it.
    Declined(Decline),
    /// The issuer asks for 3-D Secure: a PaymentIntent waits in `requires_action` until the
    /// customer authenticates; a bare charge, which cannot authenticate, is declined with
    /// [`AUTHENTICATION_REQUIRED`].
    RequiresAuthentication,
}

/// How the Charges API declines a card that needs authentication, as Stripe does.
pub(crate) const AUTHENTICATION_REQUIRED: Decline = Decline {
    code: "card_declined",
    decline_code: "authentication_required",
    message: "Your card was declined. This transaction requires authentication.",
};

/// The outcome of a test payment method; `None` for one Stripe would not find.
pub(crate) fn token_outcome(token: &str) -> Option<TokenOutcome> {
    let declined = |code, decline_code, message| {
        Some(TokenOutcome::Declined(Decline { code, decline_code, message }))
    };
    let name = token.strip_prefix("pm_card_").or_else(|| token.strip_prefix("tok_"))?;
    match name {
        "visa" | "mastercard" | "amex" | "visa_debit" | "mastercard_debit" => {
            Some(TokenOutcome::Succeeds)
        }
        "chargeDeclined" => declined("card_declined", "generic_decline", "Your card was declined."),
        "chargeDeclinedInsufficientFunds" => {
            declined("card_declined", "insufficient_funds", "Your card has insufficient funds.")
        }
        "chargeDeclinedLostCard" => {
            declined("card_declined", "lost_card", "Your card was declined.")
        }
        "chargeDeclinedStolenCard" => {
            declined("card_declined", "stolen_card", "Your card was declined.")
        }
        "chargeDeclinedExpiredCard" => {
            declined("expired_card", "expired_card", "Your card has expired.")
        }
        "chargeDeclinedIncorrectCvc" => {
            declined("incorrect_cvc", "incorrect_cvc", "Your card's security code is incorrect.")
        }
        "chargeDeclinedProcessingError" => declined(
            "processing_error",
            "processing_error",
            "An error occurred while processing your card. Try again in a little bit.",
        ),
        // Stripe has these as `pm_card_…` only.
        "authenticationRequired"
        | "authenticationRequiredOnSetup"
        | "threeDSecure2Required"
        | "threeDSecureRequired"
            if token.starts_with("pm_card_") =>
        {
            Some(TokenOutcome::RequiresAuthentication)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_of_a_token_decide_alike() {
        for name in ["visa", "chargeDeclined", "chargeDeclinedIncorrectCvc"] {
            assert_eq!(
                token_outcome(&format!("pm_card_{name}")),
                token_outcome(&format!("tok_{name}")),
                "{name}"
            );
        }
        assert_eq!(
            token_outcome("pm_card_threeDSecure2Required"),
            Some(TokenOutcome::RequiresAuthentication)
        );
        assert_eq!(token_outcome("tok_threeDSecure2Required"), None);
        assert_eq!(token_outcome("pm_card_unknown"), None);
        assert_eq!(token_outcome("visa"), None);
    }
}
