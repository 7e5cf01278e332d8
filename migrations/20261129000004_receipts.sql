-- Receipts sent for payments. One per payment: the primary key is what makes a receipt job that
-- runs twice send one receipt. `sent_at` is set once the mailer accepted it, so a job that died
-- between recording and sending sends it on its next run.

CREATE TABLE receipts (
    payment_id   text PRIMARY KEY REFERENCES payments (id),
    account_id   text NOT NULL,
    email        text NOT NULL,
    body         text NOT NULL,
    sent_at      timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now()
);
