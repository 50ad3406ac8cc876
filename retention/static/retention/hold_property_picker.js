'use strict';
// A new legal hold's property picker offers the properties of the portfolio
// chosen above it (sent as ``portfolio`` with each search; the property admin
// filters on it), and forgets a property chosen before the portfolio changed.
// The form checks the pair again on the server (a property of another
// portfolio is a form error on "property"), and the autocomplete offers no
// property at all until a portfolio is chosen (retention.admin_domain).
//
// The portfolio is added to the picker's requests by a jQuery prefilter, not
// by setting the picker up again once the page has loaded: that set-up had to
// run after Django's own (deferred by jQuery's ready), and from the second
// visit on, with every file cached, the page's load event came first, the
// set-up was skipped and the picker searched every portfolio's properties.
{
    const $ = django.jQuery;
    // A search of the hold's property picker (its data is a query string by now).
    function isPicker(data) {
        if (typeof data !== 'string') {
            return false;
        }
        const params = new URLSearchParams(data);
        return params.get('app_label') === 'retention' && params.get('model_name') === 'legalhold' &&
            params.get('field_name') === 'property';
    }

    $.ajaxPrefilter(function(options) {
        if (!isPicker(options.data)) {
            return;
        }
        const portfolio = document.getElementById('id_portfolio');
        options.data += '&portfolio=' + encodeURIComponent(portfolio ? portfolio.value : '');
    });

    $(function() {
        $('#id_portfolio').on('change', () => $('#id_property').val(null).trigger('change'));
    });
}
