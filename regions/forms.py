from django import forms


class DeploymentForm(forms.Form):
    owner = forms.ChoiceField(help_text="The tenant that owns and pays for the deployment.")
    version = forms.ChoiceField(
        label="Model version", help_text="Production and canary versions you may use."
    )
    name = forms.SlugField(max_length=40)
    replicas = forms.IntegerField(min_value=1, max_value=64, initial=1, label="Replicas per region")
    regions = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Leave empty to place in every compliant region.",
    )

    def __init__(
        self,
        *args: object,
        owners: list[tuple[str, str]],
        versions: list[tuple[str, str]],
        regions: list[tuple[str, str]],
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fields["owner"].choices = owners  # type: ignore[attr-defined]
        self.fields["version"].choices = versions  # type: ignore[attr-defined]
        self.fields["regions"].choices = regions  # type: ignore[attr-defined]


class ScaleForm(forms.Form):
    replicas = forms.IntegerField(min_value=0, max_value=64)


class RegionStatusForm(forms.Form):
    status = forms.ChoiceField(
        choices=[("active", "active"), ("draining", "draining"), ("disabled", "disabled")]
    )
    reason = forms.CharField(max_length=2000, required=False)
