from django.urls import path

from stopdesk.sso import views

urlpatterns = [
    path("sso/login/", views.start, name="sso-login"),
    path("sso/callback/", views.callback, name="sso-callback"),
    path("sso/reauth/", views.reauth, name="sso-reauth"),
    path("logout/", views.logout, name="logout"),
]
