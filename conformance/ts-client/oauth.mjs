// The TypeScript SDK v2 client (@modelcontextprotocol/client) as an OAuth
// client of physd: it is given only physd's MCP URL and client
// credentials. On physd's 401 the SDK reads the WWW-Authenticate
// challenge, fetches the RFC 9728 metadata it points at, discovers the
// authorization server named there (RFC 8414 / OpenID discovery), gets a
// token by client_credentials for the RFC 8707 resource and retries; then
// it calls a read_, can_do and a do_ with that token.
//
// Run by e2e/oauth_ts_test.go (TestOAuthTSClient), which starts the
// zitadel OP and physd and sets:
//   PHYSD_MCP_URL     physd's /mcp (the policy's identity.oauth.resource)
//   OAUTH_ISSUER      the issuer the credentials belong to (SEP-2352: they
//                     are sent to no other AS)
//   OAUTH_CLIENT_ID, OAUTH_CLIENT_SECRET, OAUTH_SCOPE
// Prints one JSON line per step; exits 1 on any failed expectation.

import { Client, ClientCredentialsProvider, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const env = (k) => {
  const v = process.env[k];
  if (!v) {
    console.error(`oauth.mjs: ${k} is not set`);
    process.exit(2);
  }
  return v;
};
const url = new URL(env('PHYSD_MCP_URL'));
const provider = new ClientCredentialsProvider({
  clientId: env('OAUTH_CLIENT_ID'),
  clientSecret: env('OAUTH_CLIENT_SECRET'),
  scope: env('OAUTH_SCOPE'),
  expectedIssuer: env('OAUTH_ISSUER'),
});

let failed = false;
const step = (name, ok, detail) => {
  console.log(JSON.stringify({ step: name, ok, detail }));
  if (!ok) failed = true;
};
const structured = (res) => {
  if (res.structuredContent) return res.structuredContent;
  const t = (res.content ?? []).find((c) => c.type === 'text');
  try {
    return JSON.parse(t?.text ?? '{}');
  } catch {
    return { text: t?.text };
  }
};

// The 2026-07-28 era: the SDK sends Mcp-Name, so physd answers a do_ the
// token's scope is too low for with 403 insufficient_scope, and the SDK
// steps up (a new token with the scope the challenge names) and retries.
const client = new Client({ name: 'physd-oauth-ts', version: '1' }, { versionNegotiation: { mode: { pin: '2026-07-28' } } });
const transport = new StreamableHTTPClientTransport(url, { authProvider: provider });
try {
  await client.connect(transport);
  const tok = provider.tokens();
  step('connect', !!tok?.access_token && client.getProtocolEra() === 'modern', { era: client.getProtocolEra(), token_type: tok?.token_type, scope: tok?.scope });

  const read = await client.callTool({ name: 'read_temperature_zone_a', arguments: {} });
  step('read_temperature_zone_a', !read.isError, structured(read));

  const plan = await client.callTool({ name: 'can_do', arguments: { intent: { semantic_tags: ['heating', 'zone_c'], action: 'set', value: 10 } } });
  const rep = structured(plan);
  step('can_do', !plan.isError && JSON.stringify(rep).includes('do_heater_zone_c'), rep);

  const act = await client.callTool({ name: 'do_heater_zone_c', arguments: { value: 10, idempotency_key: `ts-oauth-${Date.now()}` } });
  const ans = structured(act);
  step('do_heater_zone_c', !act.isError && ans.status === 'success', ans);
  step('stepped up', (provider.tokens()?.scope ?? '').split(' ').includes('physd:operate'), { scope: provider.tokens()?.scope });
} catch (e) {
  step('error', false, String(e?.stack ?? e));
} finally {
  await client.close().catch(() => {});
}
process.exit(failed ? 1 : 0);
