"""What every layer shares and nothing in nasplat is below: the checks of user-given values (`checks`), the row
schema and trial statuses (`rows`), the registry shape of every plug-in (`registry`), walks over state trees and
configs (`trees`) and the math of several objectives (`pareto`)."""
