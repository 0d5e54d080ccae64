// A real OpenID Connect provider (panva's oidc-provider, certified by the OpenID Foundation) for the
// single sign-on tests, on loopback. `node provider.mjs CONFIG.json`; the config names the port,
// the issuer, one confidential client, the private signing key (so a test can forge a token that
// only differs in what it tests) and an accounts file the test rewrites to move a person between
// groups or to disable them. The file is read again at every lookup, as a directory would be.
//
// Its own login and logout pages (no fonts or scripts from elsewhere): a login form that checks the
// account's password, consent granted for the one first-party client, and the end-session page's
// confirmation. Everything else is the library's.
import fs from 'node:fs';
import http from 'node:http';
import { URL } from 'node:url';

import Provider from 'oidc-provider';

const config = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));

function accounts() {
  return JSON.parse(fs.readFileSync(config.accounts_file, 'utf8'));
}

function esc(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function page(title, body) {
  return `<!DOCTYPE html><html><head><meta charset="utf-8"><title>${esc(title)}</title></head>`
    + `<body><main><h1>${esc(title)}</h1>${body}</main></body></html>`;
}

// The provider's storage (its documented adapter interface), in memory and ours, so that a person
// disabled in the accounts file has their sessions ended, as a directory does when someone leaves.
const store = new Map();

class MemoryStore {
  constructor(model) { this.model = model; }

  key(id) { return `${this.model}:${id}`; }

  async upsert(id, payload, expiresIn) {
    store.set(this.key(id), { payload, expiresAt: expiresIn ? Date.now() + expiresIn * 1000 : undefined });
  }

  async find(id) {
    const entry = store.get(this.key(id));
    if (!entry) return undefined;
    if (entry.expiresAt && entry.expiresAt < Date.now()) {
      store.delete(this.key(id));
      return undefined;
    }
    return entry.payload;
  }

  async findBy(field, value) {
    for (const [key, entry] of store) {
      if (key.startsWith(`${this.model}:`) && entry.payload[field] === value) return this.find(key.slice(this.model.length + 1));
    }
    return undefined;
  }

  async findByUid(uid) { return this.findBy('uid', uid); }

  async findByUserCode(userCode) { return this.findBy('userCode', userCode); }

  async consume(id) {
    const entry = store.get(this.key(id));
    if (entry) entry.payload.consumed = Math.floor(Date.now() / 1000);
  }

  async destroy(id) { store.delete(this.key(id)); }

  async revokeByGrantId(grantId) {
    for (const [key, entry] of store) if (entry.payload.grantId === grantId) store.delete(key);
  }
}

function endSessionsOfDisabled() {
  const people = accounts();
  for (const [key, entry] of store) {
    const person = people[entry.payload.accountId];
    if (key.startsWith('Session:') && (!person || person.disabled)) store.delete(key);
  }
}

const provider = new Provider(config.issuer, {
  adapter: MemoryStore,
  clients: [config.client],
  jwks: { keys: [config.signing_key] },
  cookies: { keys: ['test-provider-cookie-key'] },
  scopes: ['openid', 'email', 'profile', 'groups', 'offline_access'],
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'preferred_username'],
    groups: ['groups'],
  },
  // The groups and names in the ID token too, as Entra ID and Okta put them there; userinfo has them as well.
  conformIdTokenClaims: false,
  ttl: { IdToken: 3600, AccessToken: 3600, Session: 86400, Interaction: 600, Grant: 86400 },
  features: {
    devInteractions: { enabled: false },
    rpInitiatedLogout: {
      enabled: true,
      logoutSource: async (ctx, form) => {
        ctx.body = page('Sign out of the test provider?', `${form}<button type="submit" form="op.logoutForm" value="yes" name="logout">Yes, sign me out</button>`
          + '<button type="submit" form="op.logoutForm">No, stay signed in</button>');
      },
      postLogoutSuccessSource: async (ctx) => {
        ctx.body = page('Signed out', '<p>You are signed out of the test provider.</p>');
      },
    },
  },
  renderError: async (ctx, out) => {
    ctx.type = 'html';
    ctx.body = page('Provider error', Object.entries(out).map(([k, v]) => `<p>${esc(k)}: ${esc(v)}</p>`).join(''));
  },
  async findAccount(ctx, sub) {
    const person = accounts()[sub];
    if (!person || person.disabled) return undefined; // gone: a session of theirs no longer counts
    return {
      accountId: sub,
      async claims() {
        return {
          sub,
          email: person.email,
          email_verified: true,
          name: person.name,
          preferred_username: sub,
          groups: person.groups,
        };
      },
    };
  },
});

// What went wrong inside the provider, in its log (tests print it when they fail).
provider.on('server_error', (ctx, err) => process.stdout.write(`server_error: ${err && err.stack}\n`));

async function interaction(req, res, url) {
  const details = await provider.interactionDetails(req, res);
  const { uid, prompt, params } = details;
  if (req.method === 'POST' && url.pathname.endsWith('/login')) {
    const body = new URLSearchParams(await new Promise((resolve) => {
      let data = '';
      req.on('data', (chunk) => { data += chunk; });
      req.on('end', () => resolve(data));
    }));
    const login = body.get('login') || '';
    const person = accounts()[login];
    if (!person || person.disabled || person.password !== body.get('password')) {
      res.writeHead(200, { 'content-type': 'text/html' });
      res.end(loginPage(uid, 'Wrong name or password.'));
      return;
    }
    await provider.interactionFinished(req, res, { login: { accountId: login } }, { mergeWithLastSubmission: false });
    return;
  }
  if (prompt.name === 'login') {
    res.writeHead(200, { 'content-type': 'text/html' });
    res.end(loginPage(uid, ''));
    return;
  }
  // consent: the one first-party client gets what it asked for.
  const grant = details.grantId
    ? await provider.Grant.find(details.grantId)
    : new provider.Grant({ accountId: details.session.accountId, clientId: params.client_id });
  if (prompt.details.missingOIDCScope) grant.addOIDCScope(prompt.details.missingOIDCScope.join(' '));
  if (prompt.details.missingOIDCClaims) grant.addOIDCClaims(prompt.details.missingOIDCClaims);
  const grantId = await grant.save();
  await provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
}

function loginPage(uid, error) {
  return page('Sign in to the test provider', `${error ? `<p role="alert">${esc(error)}</p>` : ''}`
    + `<form method="post" action="/interaction/${esc(uid)}/login">`
    + '<label for="login">Username</label><input id="login" name="login" autocomplete="username" autofocus>'
    + '<label for="password">Password</label><input id="password" type="password" name="password">'
    + '<button type="submit">Sign in</button></form>');
}

const handler = provider.callback();
const server = http.createServer((req, res) => {
  const url = new URL(req.url, config.issuer);
  endSessionsOfDisabled();
  if (url.pathname.startsWith('/interaction/')) {
    interaction(req, res, url).catch((err) => {
      res.writeHead(500, { 'content-type': 'text/plain' });
      res.end(String(err && err.stack ? err.stack : err));
    });
    return;
  }
  handler(req, res);
});
server.listen(config.port, '127.0.0.1', () => {
  process.stdout.write(`listening ${config.issuer}\n`);
});
