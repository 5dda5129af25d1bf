from django.urls import path

from routing import views

app_name = "routing"

urlpatterns = [
    path("", views.routing, name="routing"),
    path("response-cache/", views.response_cache, name="response-cache"),
]
