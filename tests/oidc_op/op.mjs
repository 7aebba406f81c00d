// A real OpenID provider for the SSO tests: node-oidc-provider (the certified OpenID Connect library), on
// loopback, configured from the JSON in OP_CONFIG:
//   {"issuer", "port", "clients": [...], "accounts": {id: {claims}}, "jwks": {"keys": [...]}, "ttl": {...}}
// Sign-in uses the library's own development interactions (a login form that accepts the account id; the
// password is not checked) — the tests exercise the relying party, not the provider's password store.
// Consent is granted for the configured (first-party) clients, so the flow is: login form → back to the RP.
import Provider from 'oidc-provider';

const cfg = JSON.parse(process.env.OP_CONFIG);

const provider = new Provider(cfg.issuer, {
  clients: cfg.clients,
  jwks: cfg.jwks,
  cookies: { keys: ['spillway-test-op-cookies'] },
  scopes: ['openid', 'email', 'profile', 'groups'],
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['preferred_username', 'name'],
    groups: ['groups'],
  },
  ttl: cfg.ttl || {},
  pkce: { required: () => false },
  features: {
    devInteractions: { enabled: true },
    rpInitiatedLogout: { enabled: true },
  },
  async findAccount(ctx, id) {
    const claims = cfg.accounts[id];
    if (!claims) return undefined;
    return { accountId: id, async claims() { return { sub: id, ...claims }; } };
  },
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({ clientId: ctx.oidc.client.clientId,
                                                accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope('openid email profile groups');
    await grant.save();
    return grant;
  },
});

const server = provider.listen(cfg.port, '127.0.0.1', () => {
  console.log(`op ready ${cfg.issuer}`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
