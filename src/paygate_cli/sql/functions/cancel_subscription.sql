-- Cancelling is terminal; charges already admitted still settle.
CREATE OR REPLACE FUNCTION paygate.cancel_subscription(p_id bigint, p_reason text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE paygate.subscriptions
    SET status = 'cancelled', cancelled_at = now(), cancel_reason = p_reason, retry_at = NULL,
        past_due_since = NULL, updated_at = now()
    WHERE id = p_id AND status <> 'cancelled';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM paygate.emit_event('subscription.cancelled', jsonb_build_object('subscription_id', p_id,
                                                                            'reason', p_reason));
    RETURN true;
END
$$;
