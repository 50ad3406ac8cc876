'use strict';
// A new legal hold's property picker offers the properties of the portfolio
// chosen above it (sent as ``portfolio`` with each search; the property admin
// filters on it), and forgets a property chosen before the portfolio changed.
// The form checks the pair again on the server (a property of another
// portfolio is a form error on "property").
{
    const $ = django.jQuery;
    // After the admin's own autocomplete set-up, which runs when the DOM is ready.
    window.addEventListener('load', function() {
        const property = $('#id_property');
        const portfolio = $('#id_portfolio');
        if (!property.length || !portfolio.length || !property.data('select2')) {
            return;
        }
        const element = property[0];
        property.select2('destroy');
        property.select2({
            ajax: {
                data: (params) => ({
                    term: params.term,
                    page: params.page,
                    app_label: element.dataset.appLabel,
                    model_name: element.dataset.modelName,
                    field_name: element.dataset.fieldName,
                    portfolio: portfolio.val() || ''
                })
            }
        });
        portfolio.on('change', () => property.val(null).trigger('change'));
    });
}
