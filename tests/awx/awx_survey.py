"""AWX's survey rules, for tests: what the controller accepts as a survey and as a launch's answers.

Written after AWX's own checks (awx/api/views JobTemplateSurveySpec._validate_spec_data for the spec,
awx/main/models/mixins.py SurveyJobTemplateMixin for the answers), so that a test can tell what
an operator pressing "Launch" would be refused by the controller before any job starts, and which
extra variables the job then gets. Messages are AWX's.
"""

from __future__ import annotations

# Question types and the Python type of their default (JobTemplateSurveySpec.ALLOWED_TYPES).
ALLOWED_TYPES: dict[str, type | tuple[type, ...]] = {
    'text': str,
    'textarea': str,
    'password': str,
    'multiplechoice': str,
    'multiselect': str,
    'integer': int,
    'float': (float, int),
}


class SurveyRefused(ValueError):
    """The controller refuses the launch; ``errors`` are its messages."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__('; '.join(errors))
        self.errors = errors


def _choices(element: dict) -> list:
    choices = element.get('choices') or []
    if isinstance(choices, str):
        choices = [line for line in choices.splitlines() if line.strip() != '']
    return list(choices)


def _limit(element: dict, key: str):
    value = element.get(key)
    return None if value in ('', None) else value


def spec_errors(spec: dict) -> list[str]:
    """What AWX answers when this survey_spec is saved on a job template (empty: it is accepted)."""
    errors = []
    for field, kind in (('name', str), ('description', str), ('spec', list)):
        if field not in spec:
            errors.append("Field '%s' is missing from survey spec." % field)
        elif not isinstance(spec[field], kind):
            errors.append("Expected %s for field '%s', received %s type." % (kind.__name__, field, type(spec[field]).__name__))
    if errors:
        return errors
    if not spec['spec']:
        return ["'spec' doesn't contain any items."]
    seen = set()
    for idx, element in enumerate(spec['spec']):
        if not isinstance(element, dict):
            errors.append('Survey question %d is not a json object.' % idx)
            continue
        missing = [f for f in ('type', 'question_name', 'variable', 'required') if f not in element]
        if missing:
            errors.append("'%s' missing from survey question %d" % (missing[0], idx))
            continue
        if not isinstance(element['required'], bool):
            errors.append("'required' in survey question %d expected to be boolean." % idx)
        if element['variable'] in seen:
            errors.append("'variable' '%s' duplicated in survey question %d." % (element['variable'], idx))
        seen.add(element['variable'])
        kind = element['type']
        if kind not in ALLOWED_TYPES:
            errors.append("'%s' in survey question %d is not one of '%s' allowed question types." % (kind, idx, ', '.join(ALLOWED_TYPES)))
            continue
        if 'default' in element and not isinstance(element['default'], ALLOWED_TYPES[kind]):
            errors.append(
                'Default value %s in survey question %d expected to be %s.' % (element['default'], idx, kind if kind in ('integer', 'float') else 'string')
            )
        for key in ('min', 'max'):
            if element.get(key) is not None and not isinstance(element[key], int):
                errors.append('The %s limit in survey question %d expected to be integer.' % (key, idx))
        if kind in ('multiplechoice', 'multiselect'):
            if 'choices' not in element:
                errors.append('Survey question %d of type %s must specify choices.' % (idx, kind))
            elif 'default' in element and element['default'] not in _choices(element):
                errors.append('Default choice must be answered from the choices listed.')
    return errors


def element_errors(element: dict, answers: dict) -> list[str]:
    """AWX's check of one question against the launch's answers."""
    variable = element['variable']
    if variable not in answers:
        return ["'%s' value missing" % variable] if element['required'] else []
    value = answers[variable]
    kind = element['type']
    low, high = _limit(element, 'min'), _limit(element, 'max')
    errors = []
    if kind in ('text', 'textarea', 'password'):
        if not isinstance(value, str):
            return ["Value %s for '%s' expected to be a string." % (value, variable)]
        if low is not None and len(value) < int(low):
            errors.append("'%s' value %s is too small (length is %d must be at least %s)." % (variable, value, len(value), low))
        if high is not None and len(value) > int(high):
            errors.append("'%s' value %s is too large (must be no more than %s)." % (variable, value, high))
    elif kind in ('integer', 'float'):
        # AWX compares types exactly: True is not an integer, "3" is not either.
        if kind == 'integer' and type(value) is not int:  # pylint: disable=unidiomatic-typecheck
            return ["Value %s for '%s' expected to be an integer." % (value, variable)]
        if kind == 'float' and type(value) not in (float, int):
            return ["Value %s for '%s' expected to be a numeric type." % (value, variable)]
        if low is not None and value < (int(low) if kind == 'integer' else float(low)):
            errors.append("'%s' value %s is too small (must be at least %s)." % (variable, value, low))
        if high is not None and value > (int(high) if kind == 'integer' else float(high)):
            errors.append("'%s' value %s is too large (must be no more than %s)." % (variable, value, high))
    elif kind == 'multiplechoice':
        if value not in _choices(element):
            errors.append("Value %s for '%s' expected to be one of %s." % (value, variable, _choices(element)))
    elif kind == 'multiselect':
        if not isinstance(value, list):
            return ["'%s' value is expected to be a list." % variable]
        errors += ["Value %s for '%s' expected to be one of %s." % (v, variable, _choices(element)) for v in value if v not in _choices(element)]
    return errors


def launch_extra_vars(template: dict, answers: dict, template_extra_vars: dict | None = None) -> dict:
    """The extra variables of the job AWX starts when its survey is answered with ``answers``.

    As AWX's launch form does, questions start out with their defaults and ``answers`` replaces them;
    a question left empty (not in ``answers``, no default) is not sent. The controller then checks
    every question (SurveyRefused with its messages) and refuses answers that are not questions (the
    templates do not prompt for extra variables). Otherwise the job's extra variables are the
    template's, then the defaults that pass their own question, then the answers.
    """
    spec = template['survey_spec']
    submitted = dict((e['variable'], e['default']) for e in spec['spec'] if e.get('default') is not None)
    submitted.update(answers)
    errors = [error for element in spec['spec'] for error in element_errors(element, submitted)]
    unknown = sorted(set(submitted) - set(element['variable'] for element in spec['spec']))
    if unknown:
        errors.append(
            'Variables %s are not allowed on launch. Check the Prompt on Launch setting on the Job Template to include Extra Variables.' % ', '.join(unknown)
        )
    if errors:
        raise SurveyRefused(errors)
    extra_vars = dict(template_extra_vars or {})
    for element in spec['spec']:
        if element.get('default') is not None and not element_errors(element, {element['variable']: element['default']}):
            extra_vars[element['variable']] = element['default']
    extra_vars.update(submitted)
    return extra_vars
