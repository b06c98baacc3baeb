"""Session service: owns authentication (tenant from `tenant/name`, users with argon2 or bcrypt
hashes in the store, cached in Redis), ACLs (returned with the CONNECT answer and enforced on
the node), and the session registry in Redis (which node holds which client, with an epoch so
that of two racing CONNECTs exactly one wins and the loser's node is told to close it with
0x8E). Admin API: users, ACLs, client listing and kick. Persistent session state arrives with
the persistence issue.
"""
