from django import forms

from registry.choices import ModelTask, Visibility


class ModelForm(forms.Form):
    owner = forms.ChoiceField(help_text="The tenant that owns the model, or the platform for catalog models.")
    name = forms.SlugField(max_length=100)
    task = forms.ChoiceField(choices=ModelTask.choices)
    visibility = forms.ChoiceField(choices=Visibility.choices, initial=Visibility.PRIVATE)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False, max_length=5000)
    license = forms.CharField(max_length=100, required=False)

    def __init__(self, *args: object, owners: list[tuple[str, str]], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fields["owner"].choices = owners  # type: ignore[attr-defined]


class TransitionForm(forms.Form):
    to = forms.CharField(max_length=16)
    reason = forms.CharField(max_length=2000, required=False)
    override = forms.BooleanField(required=False)


class RollbackForm(forms.Form):
    reason = forms.CharField(max_length=2000)
