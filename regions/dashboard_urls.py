from django.urls import path

from regions import views

app_name = "regions"

urlpatterns = [
    path("", views.region_list, name="list"),
    path("<str:code>/", views.region_detail, name="region"),
    path("<str:code>/status/", views.region_status, name="status"),
]
