"""Quota service: owns per-tenant limits (connections, sessions, subscriptions, message rate,
bandwidth, queue depth) kept in Redis, and hands budgets to nodes as time-boxed leases.
`SetLimits`/`GetLimits` manage a tenant's limits; `AcquireLease` grants up to the remaining
budget of one resource in the current one-second window (rates) or in total (counts).
`HoldSubscriptions` keeps each node's figure in a tenant's subscription count and grants
slots below its `max_tenant_subscriptions` (services/common/subscription_counts.py).
"""
