"""Single sign-on through an OpenID Connect provider (Okta, Entra ID, Google Workspace, Keycloak),
beside local accounts, built on mozilla-django-oidc.

On when STOPDESK_OIDC_ISSUER is set (`environment`); off, nothing here answers and stopdesk has
local accounts only. A person's roles follow their groups at the provider: they are set from the
group claim at every sign-in and at every re-check, which happens once a short session lifetime
has passed (`middleware`): the browser goes back to the provider with `prompt=none`, and a removed
group, or a person the provider no longer knows, loses the role, or the session, at that request.
An approval asks the provider for a fresh sign-in (`prompt=login`, `max_age=0`) and counts it only
when the returned ID token's `auth_time` is that recent (`views.reauth`, `views.callback`).
"""
