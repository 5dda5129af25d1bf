from django.apps import AppConfig


class ShellConfig(AppConfig):
    """The project shell: settings, root URLs, the Celery app, ASGI/WSGI, the fleet Overview and the
    commands that run or seed the whole stack. It is installed only for those commands, templates and static
    files; it has no models."""

    name = "controlplane"
    label = "shell"
    verbose_name = "Control plane"
